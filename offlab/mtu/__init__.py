"""MTU arithmetic (`offlab mtu calc`, mtu/calc.py) and path-MTU probing inside labs (`offlab mtu probe`,
mtu/probe.py). Each is imported by name: the arithmetic alone needs neither hosts nor netdev."""
