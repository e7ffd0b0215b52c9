//! Developer entry points: `cargo xtask <command>` (see `cargo xtask --help`).
//!
//! Each command lives in its own module; `util` echoes and runs subprocesses.
mod apt;
mod bench;
mod codegen;
mod consumers;
mod demo;
mod freethreaded;
mod fuzz;
mod image;
mod run;
mod setup;
mod sidroot;
mod test;
mod util;
mod venv;
mod vm;

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
    /// Regenerate the Rust types of the vendored .proto files (profiler/src/proto/).
    ///
    /// protox compiles profiler/proto/ and prost-build writes the Rust: no protoc needed.
    /// `--check` writes nothing and fails when the checked-in code is out of date.
    Codegen(codegen::CodegenArgs),
    /// Create (once) the Debian sid root with CPython 3.13, 3.14 and 3.15 for the tests.
    Sidroot(sidroot::SidrootArgs),
    /// Build (once) a free-threaded CPython 3.13 (`--disable-gil`) for the tests.
    ///
    /// From Debian's python3.13 source tarball (sha256 pinned), into
    /// /var/cache/pyebpf/python3.13t: about 4 min of CPU the first time, under a second
    /// once built. `cargo xtask test` runs it.
    Freethreaded(freethreaded::FreethreadedArgs),
    /// Run every test: fmt check, setup, sid root, build pyebpf, `cargo test --workspace`.
    Test(test::TestArgs),
    /// Build the OCI image localhost/pyebpf:latest (podman, a Debian base; no registry).
    ///
    /// The base is only the libraries the binary links (libc6, libgcc-s1), unpacked by
    /// mmdebstrap and cached in /var/cache/pyebpf/image/; the entrypoint is `pyebpf`, the
    /// default command `agent`. packaging/kubernetes/daemonset.yaml runs it. Installs podman,
    /// runc and mmdebstrap when missing.
    Image(image::ImageArgs),
    /// Profile examples/demo.py for 5 s and write pyebpf-demo.svg.
    Demo,
    /// Build pyebpf in release mode.
    Build,
    /// Build pyebpf in release mode and run it with ARGS.
    Run(run::RunArgs),
    /// Overhead and accuracy of pyebpf vs py-spy and Tachyon; writes BENCHMARKS.md.
    Bench(bench::BenchArgs),
    /// `dump` of a busy process: whole stacks and time per dump, beside py-spy dump.
    ///
    /// Runs tests/workloads/dump_busy.py (CPU-bound, its stack changing tens of thousands of
    /// times a second) under each interpreter and takes --dumps dumps with `pyebpf dump`,
    /// `py-spy dump` and `py-spy dump --nonblocking` in turn; counts the dumps whose main
    /// thread's stack is whole and right, their wall time, and the target's speed meanwhile.
    /// Writes target/bench/dump.json and BENCHMARKS.md's dump section.
    BenchDump(bench::dump::BenchDumpArgs),
    /// Fuzz the parsers of data read from other processes (cargo-fuzz, libFuzzer).
    ///
    /// Runs each target in fuzz/ (or TARGET) for --seconds (or --runs inputs) with low memory
    /// limits and a timeout, and prints executions, coverage and crashes per target. Installs
    /// cargo-fuzz and the nightly toolchain when missing. `--seeds` regenerates fuzz/seeds/
    /// from the interpreters the tests use. Not part of `test`.
    Fuzz(fuzz::FuzzArgs),
    /// Smoke-test pyebpf on other kernels: boot each under qemu and run a few real tests.
    ///
    /// Each kernel is booted under qemu (emulated: no KVM here) with virtme-ng, which shows
    /// the guest this machine's filesystem; inside, a few of the real integration tests run on
    /// the real BPF programs: `pyebpf check`, record's exact `<module>;top;mid;leaf` chain on
    /// Debian's python3.11 and on a pyenv 3.12, a process started mid-recording being caught,
    /// and exit cleanup after 100 processes. qemu, busybox, the kernels and virtme-ng are
    /// installed on first use.
    ///
    /// `--kernel host` boots nothing: the running kernel cannot be booted under qemu (no image
    /// in /boot, no modules), so the same rows run directly on this machine, inside a private
    /// mount namespace (`unshare -m`) with /sys/kernel/tracing and /sys/kernel/debug
    /// unmounted, like a fresh machine.
    ///
    /// Ends with a table per kernel (uname -r, boot time, each row with its duration); the
    /// full output of each kernel is in target/vm-test/<kernel>.log. Exits 1 if anything
    /// failed.
    VmTest(vm::VmTestArgs),
    /// The runner of `vm-test` inside a guest (internal).
    #[command(hide = true)]
    VmGuest(vm::guest::GuestArgs),
}

fn main() {
    let cli = Cli::parse();
    let result = match cli.command {
        Cmd::Setup(args) => setup::setup(&args),
        Cmd::Codegen(args) => codegen::codegen(&args),
        Cmd::Sidroot(args) => sidroot::sidroot(&args).map(|_| ()),
        Cmd::Freethreaded(args) => freethreaded::freethreaded(&args).map(|_| ()),
        Cmd::Test(args) => test::test(&args),
        Cmd::Image(args) => image::image(&args),
        Cmd::Demo => demo::demo(),
        Cmd::Fuzz(args) => fuzz::fuzz(&args),
        Cmd::Build => run::build_release().map(|_| ()),
        Cmd::Bench(args) => bench::bench(&args),
        Cmd::BenchDump(args) => bench::dump::bench_dump(&args),
        Cmd::VmTest(args) => vm::vm_test(&args),
        Cmd::VmGuest(args) => vm::guest::guest(&args),
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
