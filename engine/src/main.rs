//! offlab-engine: offlab's UDP traffic generator (GSO/GRO, batching, pacing,
//! loss/jitter/latency accounting). One JSON object on stdout per run;
//! see SCHEMA.md. Exit codes: 0 ok, 2 bad arguments, 3 environment.

mod args;
mod argv;
mod gro;
mod header;
mod json;
mod pacing;
mod rr;
mod rr_args;
mod rr_server;
mod rr_wire;
mod histogram;
mod rx;
mod series;
mod stats;
mod sys;
mod tx;
mod uring;

use std::io::Write;
use std::process::exit;

/// Why a run could not produce a report.
#[derive(Debug)]
pub enum Failure {
    /// The arguments cannot work (here): exit 2.
    Arg(String),
    /// The environment refused (bind, permission, kernel feature): exit 3.
    Env(String),
}

fn fail(code: i32, msg: &str) -> ! {
    eprintln!("offlab-engine: error: {}", msg);
    exit(code);
}

fn main() {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let cmd = match args::parse(&argv) {
        Ok(c) => c,
        Err(e) => fail(2, &e.0),
    };
    let result = match cmd {
        args::Command::Help(text) => {
            print!("{}", text);
            return;
        }
        args::Command::Version => {
            println!("offlab-engine {}", env!("CARGO_PKG_VERSION"));
            return;
        }
        args::Command::Rx(o) => rx::run(&o),
        args::Command::Tx(o) => tx::run(&o),
        args::Command::Rr(o) => rr::run(&o),
        args::Command::RrServer(o) => rr_server::run(&o),
    };
    match result {
        Ok(v) => {
            let mut out = std::io::stdout();
            let text = json::to_string(&v);
            if writeln!(out, "{}", text).and_then(|_| out.flush()).is_err() {
                exit(3);
            }
        }
        Err(Failure::Arg(m)) => fail(2, &m),
        Err(Failure::Env(m)) => fail(3, &m),
    }
}
