use clap::Parser;
use profiler::cli::{Cli, Command};

fn main() {
    let cli = Cli::parse();
    let level = match cli.verbose {
        0 => "warn",
        1 => "info",
        _ => "debug",
    };
    env_logger::Builder::from_env(
        env_logger::Env::default().default_filter_or(format!("profiler={level},pyebpf={level}")),
    )
    .format_timestamp(None)
    .init();
    let result = match cli.command {
        Command::Record(args) => profiler::record::run(args),
        Command::Top(args) => profiler::top::run(args),
        Command::Check(args) => profiler::check::run(args),
        Command::Agent(args) => profiler::agent::run(args),
        Command::Dump(args) => profiler::dump::run(args),
    };
    match result {
        Ok(code) => std::process::exit(code),
        Err(err) => {
            eprintln!("pyebpf: error: {err:#}");
            std::process::exit(profiler::exit_code(&err));
        }
    }
}
