//! The pieces every subcommand's parser shares: `--opt VALUE | --opt=VALUE | --flag`, and the
//! checked numbers, addresses and durations. A leaf: it knows no subcommand.

use std::net::IpAddr;

use crate::series::MAX_INTERVAL_MS;

/// What a subcommand's parser found: options to run with, or its help text.
#[derive(Debug, Clone, PartialEq)]
pub enum Parsed<T> {
    Run(T),
    Help(&'static str),
}

/// Largest UDP payload: 65535 - 20 (IPv4) - 8 (UDP).
pub const MAX_PAYLOAD_V4: usize = 65507;

/// Largest UDP payload without jumbograms: 65535 - 8 (the IPv6 header is not counted).
pub const MAX_PAYLOAD_V6: usize = 65527;

/// A bad argument: the message names the option and what is allowed.
#[derive(Debug, Clone, PartialEq)]
pub struct ArgError(pub String);

pub fn err<T>(msg: String) -> Result<T, ArgError> {
    Err(ArgError(msg))
}

/// Splits `--opt=value` / `--opt value` into (name, value).
pub struct Args<'a> {
    pub argv: &'a [String],
    pub i: usize,
}

impl<'a> Args<'a> {
    pub fn next_opt(&mut self) -> Option<(String, Option<String>)> {
        let a = self.argv.get(self.i)?;
        self.i += 1;
        if let Some((k, v)) = a.split_once('=') {
            if k.starts_with("--") {
                return Some((k.to_string(), Some(v.to_string())));
            }
        }
        Some((a.clone(), None))
    }

    pub fn value(&mut self, name: &str, inline: Option<String>) -> Result<String, ArgError> {
        if let Some(v) = inline {
            return Ok(v);
        }
        match self.argv.get(self.i) {
            Some(v) => {
                self.i += 1;
                Ok(v.clone())
            }
            None => err(format!("{} needs a value", name)),
        }
    }
}

pub fn no_value(name: &str, inline: &Option<String>) -> Result<(), ArgError> {
    if inline.is_some() {
        return err(format!("{} takes no value", name));
    }
    Ok(())
}

pub fn unknown(opt: &str, cmd: &str) -> String {
    if opt.starts_with('-') {
        format!("unknown option '{}' for {} (see offlab-engine {} --help)", opt, cmd, cmd)
    } else {
        format!("unexpected argument '{}' for {} (options start with --)", opt, cmd)
    }
}

/// `--interval MS`: whole milliseconds, 0 (no series) .. 60000.
pub fn parse_interval(v: &str) -> Result<u64, ArgError> {
    let t = v.strip_suffix("ms").unwrap_or(v);
    match t.parse::<u64>() {
        Ok(n) if n <= MAX_INTERVAL_MS => Ok(n),
        _ => err(format!(
            "--interval '{}': must be whole milliseconds 0..{} (0 = no per-interval rows; e.g. 100)",
            v, MAX_INTERVAL_MS
        )),
    }
}

pub fn parse_addr(name: &str, v: &str) -> Result<IpAddr, ArgError> {
    // Accept the bracketed IPv6 form people paste from URLs.
    let t = v.trim_start_matches('[').trim_end_matches(']');
    match t.parse::<IpAddr>() {
        Ok(a) => Ok(a),
        Err(_) => err(format!("{} '{}': not an IPv4 or IPv6 address", name, v)),
    }
}

pub fn parse_int(name: &str, v: &str, min: u64, max: u64) -> Result<u64, ArgError> {
    match v.parse::<u64>() {
        Ok(n) if n >= min && n <= max => Ok(n),
        _ => err(format!("{} '{}': must be an integer {}..{}", name, v, min, max)),
    }
}

/// Seconds: `2`, `2.5`, `2s`, `500ms`.
pub fn parse_seconds(name: &str, v: &str, zero_ok: bool) -> Result<f64, ArgError> {
    let (num, scale) = if let Some(n) = v.strip_suffix("ms") {
        (n, 1e-3)
    } else if let Some(n) = v.strip_suffix('s') {
        (n, 1.0)
    } else {
        (v, 1.0)
    };
    let lo = if zero_ok { "0" } else { "more than 0" };
    match num.parse::<f64>() {
        Ok(x) if x.is_finite() && x >= 0.0 && (zero_ok || x > 0.0) && x * scale <= 1e7 => {
            Ok(x * scale)
        }
        _ => err(format!(
            "{} '{}': must be seconds, {} to 10000000 (e.g. 2, 2.5, 500ms)",
            name, v, lo
        )),
    }
}

/// Buffer sizes: `4194304`, `4M`/`4MiB` (binary units: K, M, G).
pub fn parse_bytes(name: &str, v: &str) -> Result<u64, ArgError> {
    let lower = v.to_ascii_lowercase();
    let t = lower
        .strip_suffix("ib")
        .or_else(|| lower.strip_suffix('b'))
        .unwrap_or(&lower);
    let (num, mult) = match t.chars().last() {
        Some('k') => (&t[..t.len() - 1], 1u64 << 10),
        Some('m') => (&t[..t.len() - 1], 1u64 << 20),
        Some('g') => (&t[..t.len() - 1], 1u64 << 30),
        _ => (t, 1u64),
    };
    match num.parse::<u64>() {
        Ok(n) if n.checked_mul(mult).map_or(false, |b| b <= i32::MAX as u64) => Ok(n * mult),
        _ => err(format!(
            "{} '{}': must be bytes 0..2147483647, optionally with K, M or G (KiB, MiB, GiB)",
            name, v
        )),
    }
}
