//! Developer entry points: `cargo xtask <command>` (see `cargo xtask --help`).
//!
//! Each command lives in its own module; `util` echoes and runs subprocesses.
mod bench;
mod bench_proc;
mod bench_report;
mod bench_run;
mod demo;
mod run;
mod setup;
mod sidroot;
mod test;
mod util;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "cargo xtask", about = "pyebpf developer tasks", version)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Install what building the BPF side needs: nightly rust-src and bpf-linker.
    Setup(setup::SetupArgs),
    /// Create (once) the Debian sid root with CPython 3.13, 3.14 and 3.15 for the tests.
    Sidroot(sidroot::SidrootArgs),
    /// Run every test: fmt check, setup, sid root, build pyebpf, `cargo test --workspace`.
    Test(test::TestArgs),
    /// Profile examples/demo.py for 5 s and write pyebpf-demo.svg.
    Demo,
    /// Build pyebpf in release mode.
    Build,
    /// Build pyebpf in release mode and run it with ARGS.
    Run(run::RunArgs),
    /// Overhead and accuracy of pyebpf vs py-spy and Tachyon; writes BENCHMARKS.md.
    Bench(bench::BenchArgs),
}

fn main() {
    let cli = Cli::parse();
    let result = match cli.command {
        Cmd::Setup(args) => setup::setup(&args),
        Cmd::Sidroot(args) => sidroot::sidroot(&args).map(|_| ()),
        Cmd::Test(args) => test::test(&args),
        Cmd::Demo => demo::demo(),
        Cmd::Build => run::build_release().map(|_| ()),
        Cmd::Bench(args) => bench::bench(&args),
        Cmd::Run(args) => match run::run(&args) {
            Ok(code) => std::process::exit(code),
            Err(e) => Err(e),
        },
    };
    if let Err(err) = result {
        eprintln!("error: {err:#}");
        std::process::exit(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Cmd {
        Cli::try_parse_from(std::iter::once("xtask").chain(args.iter().copied()))
            .expect("parses")
            .command
    }

    #[test]
    fn test_passes_cargo_and_harness_args_through() {
        let Cmd::Test(t) = parse(&["test", "--", "-p", "tests", "sid", "--", "--nocapture"]) else {
            panic!("not test")
        };
        assert_eq!(t.args, ["-p", "tests", "sid", "--", "--nocapture"]);
        let Cmd::Test(t) = parse(&["test"]) else {
            panic!("not test")
        };
        assert!(t.args.is_empty() && !t.no_sidroot);
    }

    #[test]
    fn run_passes_pyebpf_args_through() {
        for argv in [
            &["run", "--", "record", "-d", "5", "--", "python3", "x.py"][..],
            &["run", "record", "-d", "5", "--", "python3", "x.py"][..],
        ] {
            let Cmd::Run(r) = parse(argv) else {
                panic!("not run")
            };
            assert_eq!(r.args, ["record", "-d", "5", "--", "python3", "x.py"]);
        }
    }
}
