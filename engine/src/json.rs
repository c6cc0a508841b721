//! A tiny JSON value and writer: enough for the engine's one-object reports.

use std::fmt::Write;

#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Null,
    Bool(bool),
    U64(u64),
    F64(f64),
    Str(String),
    #[allow(dead_code)] // only tests build arrays so far
    Arr(Vec<Value>),
    Obj(Vec<(String, Value)>),
}

/// Builds an object field by field, keeping insertion order.
#[derive(Debug, Default)]
pub struct Obj {
    fields: Vec<(String, Value)>,
}

/// The schema every report names; offlab's driver refuses another (traffic/engine.py).
pub const SCHEMA: &str = "offlab-engine/1";

/// Every report begins the same way: schema, role, the engine's version, the options it ran with.
pub fn envelope(role: &str, options: Obj) -> Obj {
    let mut out = Obj::new();
    out.s("schema", SCHEMA)
        .s("role", role)
        .s("version", env!("CARGO_PKG_VERSION"))
        .obj("options", options);
    out
}

impl Obj {
    pub fn new() -> Obj {
        Obj { fields: Vec::new() }
    }
    pub fn set(&mut self, key: &str, v: Value) -> &mut Obj {
        self.fields.push((key.to_string(), v));
        self
    }
    pub fn u(&mut self, key: &str, v: u64) -> &mut Obj {
        self.set(key, Value::U64(v))
    }
    pub fn f(&mut self, key: &str, v: f64) -> &mut Obj {
        self.set(key, Value::F64(v))
    }
    pub fn b(&mut self, key: &str, v: bool) -> &mut Obj {
        self.set(key, Value::Bool(v))
    }
    pub fn s(&mut self, key: &str, v: &str) -> &mut Obj {
        self.set(key, Value::Str(v.to_string()))
    }
    pub fn null(&mut self, key: &str) -> &mut Obj {
        self.set(key, Value::Null)
    }
    pub fn opt_u(&mut self, key: &str, v: Option<u64>) -> &mut Obj {
        match v {
            Some(x) => self.u(key, x),
            None => self.null(key),
        }
    }
    pub fn opt_f(&mut self, key: &str, v: Option<f64>) -> &mut Obj {
        match v {
            Some(x) => self.f(key, x),
            None => self.null(key),
        }
    }
    pub fn opt_s(&mut self, key: &str, v: Option<&str>) -> &mut Obj {
        match v {
            Some(x) => self.s(key, x),
            None => self.null(key),
        }
    }
    pub fn obj(&mut self, key: &str, o: Obj) -> &mut Obj {
        self.set(key, o.into_value())
    }
    pub fn into_value(self) -> Value {
        Value::Obj(self.fields)
    }
}

pub fn to_string(v: &Value) -> String {
    let mut out = String::new();
    write_value(&mut out, v);
    out
}

fn write_value(out: &mut String, v: &Value) {
    match v {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::U64(n) => {
            let _ = write!(out, "{}", n);
        }
        Value::F64(x) => write_f64(out, *x),
        Value::Str(s) => write_str(out, s),
        Value::Arr(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_value(out, item);
            }
            out.push(']');
        }
        Value::Obj(fields) => {
            out.push('{');
            for (i, (k, item)) in fields.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_str(out, k);
                out.push_str(": ");
                write_value(out, item);
            }
            out.push('}');
        }
    }
}

/// Non-finite numbers have no JSON spelling: they become null.
/// Finite ones are rounded to 6 significant decimals after the point, which
/// keeps reports readable without losing anything a measurement can support.
fn write_f64(out: &mut String, x: f64) {
    if !x.is_finite() {
        out.push_str("null");
        return;
    }
    if x == x.trunc() && x.abs() < 1e15 {
        let _ = write!(out, "{}", x as i64);
        return;
    }
    let mut s = format!("{:.6}", x);
    while s.ends_with('0') {
        s.pop();
    }
    if s.ends_with('.') {
        s.pop();
    }
    if s == "-0" {
        s = "0".to_string();
    }
    out.push_str(&s);
}

fn write_str(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn object_keeps_order_and_escapes_strings() {
        let mut o = Obj::new();
        o.s("schema", "offlab-engine/1")
            .u("n", 3)
            .b("ok", true)
            .null("none")
            .s("q", "a\"b\\c\n\u{1}");
        assert_eq!(
            to_string(&o.into_value()),
            "{\"schema\": \"offlab-engine/1\", \"n\": 3, \"ok\": true, \
             \"none\": null, \"q\": \"a\\\"b\\\\c\\n\\u0001\"}"
        );
    }

    #[test]
    fn floats_are_plain_decimals_and_non_finite_is_null() {
        let v = Value::Arr(vec![
            Value::F64(2.0),
            Value::F64(0.125),
            Value::F64(1.0 / 3.0),
            Value::F64(f64::NAN),
            Value::F64(f64::INFINITY),
            Value::F64(-0.0000001),
            Value::F64(42e9),
        ]);
        assert_eq!(
            to_string(&v),
            "[2, 0.125, 0.333333, null, null, 0, 42000000000]"
        );
    }
}
