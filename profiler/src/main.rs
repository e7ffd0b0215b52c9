use clap::Parser;
use profiler::cli::Cli;

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
    let result = profiler::run(cli.command);
    match result {
        Ok(code) => std::process::exit(code),
        Err(err) => {
            eprintln!("pyebpf: error: {err:#}");
            std::process::exit(profiler::exit_code(&err));
        }
    }
}
