"""Plans: YAML → validated, typed objects. No code is executed from a plan.

A plan names a topology, axes of named values, a workload, a repeat policy and a
baseline. Each axis value may set workload parameters, topology parameters,
ethtool features or any other knob on named hosts. Errors name the file, the line
and the field, and say what is allowed; everything that can be judged without a
lab is judged at load time.

Modules: `models` (the typed parts), `axes` (values, filters, cells), `checks` (hosts,
interfaces, knobs, values, tools), `topology` (each topology's hosts, statically),
`errors` (file:line messages), `load` (the top level).
"""

from offlab.experiment.plan.axes import FLAT_ALIASES, MAX_CELLS, TOPOLOGY_KEYS, WORKLOAD_KEYS, expand
from offlab.experiment.plan.checks import check_tools, no_op_warnings, required_tools
from offlab.experiment.plan.errors import PlanErrors
from offlab.experiment.plan.load import TOP_KEYS, load_plan, load_plan_file
from offlab.experiment.plan.models import AxisValue, CaptureSpec, Cell, Plan, RepeatSpec, TopologySpec, WorkloadSpec

__all__ = [
    "AxisValue", "CaptureSpec", "Cell", "Plan", "PlanErrors", "RepeatSpec", "TopologySpec", "WorkloadSpec",
    "FLAT_ALIASES", "MAX_CELLS", "TOPOLOGY_KEYS", "TOP_KEYS", "WORKLOAD_KEYS",
    "check_tools", "no_op_warnings", "expand", "load_plan", "load_plan_file", "required_tools",
]
