//! The program a command line runs, named for a service: the script, the module, or for a
//! known launcher (gunicorn, uvicorn, celery, flask, django, …) the application it serves.
//! The third source of a service name (see [`super`]), after the environment and the pod.
//!
//! Bounds: at most [`MAX_ARGS`] arguments are looked at, and a name is cut to
//! [`MAX_DERIVED_VALUE`] bytes. Command lines are another process's data: nothing here panics
//! on them.

use super::environ::Environ;
use super::{basename, cap, MAX_ARGS, MAX_DERIVED_VALUE};

/// What a command line says the program is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Program {
    /// The service name it gives: the application, else the launcher, script or module.
    pub(crate) name: String,
    /// The launcher that runs the application (`gunicorn`, `celery`, …), when it is a known one.
    pub(crate) launcher: Option<&'static str>,
}

impl Program {
    fn named(name: &str) -> Program {
        Program {
            name: cap(name, MAX_DERIVED_VALUE),
            launcher: None,
        }
    }
}

/// How a known launcher names the application it runs.
struct Launcher {
    /// The service name when no application is found.
    name: &'static str,
    /// Its console-script names and `python -m` module names.
    commands: &'static [&'static str],
    /// Options whose value is the application (`-A proj`, `--app=proj`, `-Aproj`).
    app_options: &'static [&'static str],
    /// Whether a positional argument is the application (`gunicorn app:app`). Launchers
    /// whose positionals are subcommands (`celery … worker`, `flask run`) say no.
    positional_app: bool,
    /// Options that take a separate value which is not the application (`-k
    /// uvicorn.workers.UvicornWorker`), so that value is not mistaken for one. Only the common
    /// ones: an unlisted option's value can only win when no `module:attr` argument is there.
    value_options: &'static [&'static str],
    /// An environment variable the launcher reads the application from.
    app_env: Option<fn(&Environ) -> Option<&str>>,
    /// Keep only the top-level package of the application (`mysite.settings` → `mysite`).
    top_package: bool,
}

const LAUNCHERS: &[Launcher] = &[
    Launcher {
        name: "gunicorn",
        commands: &["gunicorn"],
        app_options: &[],
        positional_app: true,
        value_options: &[
            "-b",
            "--bind",
            "-w",
            "--workers",
            "-k",
            "--worker-class",
            "-c",
            "--config",
            "-t",
            "--timeout",
            "--threads",
            "-n",
            "--name",
            "--chdir",
            "--pythonpath",
            "-e",
            "--env",
            "-u",
            "--user",
            "-g",
            "--group",
            "-p",
            "--pid",
            "-m",
            "--umask",
            "--log-level",
            "--log-file",
            "--log-config",
            "--access-logfile",
            "--error-logfile",
            "--max-requests",
            "--max-requests-jitter",
            "--graceful-timeout",
            "--keep-alive",
            "--worker-connections",
            "--backlog",
            "--certfile",
            "--keyfile",
            "--paste",
            "--worker-tmp-dir",
            "--forwarded-allow-ips",
            "--statsd-host",
        ],
        app_env: None,
        top_package: false,
    },
    Launcher {
        name: "uvicorn",
        commands: &["uvicorn"],
        app_options: &[],
        positional_app: true,
        value_options: &[
            "--host",
            "--port",
            "--uds",
            "--fd",
            "--workers",
            "--loop",
            "--http",
            "--ws",
            "--lifespan",
            "--interface",
            "--env-file",
            "--log-config",
            "--log-level",
            "--root-path",
            "--app-dir",
            "--limit-concurrency",
            "--limit-max-requests",
            "--backlog",
            "--timeout-keep-alive",
            "--ssl-keyfile",
            "--ssl-certfile",
            "--forwarded-allow-ips",
            "--reload-dir",
            "--header",
        ],
        app_env: None,
        top_package: false,
    },
    Launcher {
        name: "hypercorn",
        commands: &["hypercorn"],
        app_options: &[],
        positional_app: true,
        value_options: &[
            "-b",
            "--bind",
            "-w",
            "--workers",
            "-k",
            "--worker-class",
            "-c",
            "--config",
            "--root-path",
            "--certfile",
            "--keyfile",
            "--log-level",
            "--access-logfile",
            "--error-logfile",
            "--log-config",
            "-m",
            "--umask",
            "-u",
            "--user",
            "-g",
            "--group",
            "--backlog",
            "--graceful-timeout",
            "--keep-alive",
        ],
        app_env: None,
        top_package: false,
    },
    Launcher {
        name: "daphne",
        commands: &["daphne"],
        app_options: &[],
        positional_app: true,
        value_options: &[
            "-b",
            "--bind",
            "-p",
            "--port",
            "-u",
            "--unix-socket",
            "--fd",
            "-e",
            "--endpoint",
            "-v",
            "--verbosity",
            "--access-log",
            "--root-path",
            "-t",
            "--http-timeout",
            "--websocket-timeout",
            "--application-close-timeout",
        ],
        app_env: None,
        top_package: false,
    },
    Launcher {
        name: "waitress",
        commands: &["waitress-serve", "waitress"],
        app_options: &[],
        positional_app: true,
        value_options: &[
            "--host",
            "--port",
            "--listen",
            "--threads",
            "--url-scheme",
            "--ident",
        ],
        app_env: None,
        top_package: false,
    },
    Launcher {
        name: "granian",
        commands: &["granian"],
        app_options: &[],
        positional_app: true,
        value_options: &[
            "--interface",
            "--host",
            "--port",
            "--workers",
            "--threads",
            "--blocking-threads",
            "--loop",
            "--http",
            "--log-level",
            "--log-config",
            "--ssl-keyfile",
            "--ssl-certificate",
            "--url-path-prefix",
            "--working-dir",
        ],
        app_env: None,
        top_package: false,
    },
    Launcher {
        name: "celery",
        commands: &["celery"],
        app_options: &["-A", "--app"],
        positional_app: false,
        value_options: &[],
        app_env: None,
        top_package: false,
    },
    Launcher {
        name: "flask",
        commands: &["flask"],
        app_options: &["-A", "--app"],
        positional_app: false,
        value_options: &[],
        app_env: Some(|env| env.flask_app.as_deref()),
        top_package: false,
    },
    Launcher {
        // `manage.py` is matched by its file name; see `program_from_argv`.
        name: "django",
        commands: &["django-admin", "django-admin.py"],
        app_options: &["--settings"],
        positional_app: false,
        value_options: &[],
        app_env: Some(|env| env.django_settings_module.as_deref()),
        top_package: true,
    },
];

fn launcher(command: &str) -> Option<&'static Launcher> {
    LAUNCHERS.iter().find(|l| l.commands.contains(&command))
}

/// The program a command line runs, named for a service.
///
/// `argv[0]` is the interpreter for scripts, modules and console scripts alike: the kernel
/// runs a script's `#!` interpreter with the script's path as `argv[1]`, so
/// `/venv/bin/gunicorn app:app` is `[/venv/bin/python3, /venv/bin/gunicorn, app:app]`.
/// CPython's options are skipped as CPython parses them: flags may be grouped (`-uB`), and
/// `-W`, `-X`, `-c`, `-m` take a value, attached (`-Wignore`) or next (`-X dev`); `-c` and `-m`
/// end the options, as does the first non-option, the script. Then:
///
/// * `-c …`, `-` (stdin) and no script at all (a REPL) → `python`.
/// * `-m module` → the module, unless it is a launcher (`python -m celery -A proj worker`).
/// * a script → its file name without `.py`/`.pyz`, unless that is a launcher
///   (`/venv/bin/gunicorn`) or Django's `manage.py`.
/// * a launcher → its application when given (`--app`/`-A`, a positional `module:attr`, or
///   the launcher's own environment variable: `FLASK_APP`, `DJANGO_SETTINGS_MODULE`), reduced to
///   a module (`app:create_app()` → `app`, `hello.py` → `hello`, Django's `mysite.settings` →
///   `mysite`), else the launcher's name.
///
/// When `argv[0]` is not a Python interpreter, the process is an embedding (`uwsgi`), a frozen
/// program, or one that rewrote its command line (`setproctitle`, as gunicorn does: `gunicorn:
/// worker [app:app]`); its first word names it, and is read as a launcher if it is one.
pub(crate) fn program_from_argv(argv: &[&str], env: &Environ) -> Option<Program> {
    let argv = &argv[..argv.len().min(MAX_ARGS)];
    let (&argv0, rest) = argv.split_first()?;
    if !is_python(basename(argv0)) {
        return Some(not_python(argv0, rest, env));
    }
    let mut i = 0;
    while let Some(&arg) = rest.get(i) {
        i += 1;
        if arg == "--" {
            break;
        }
        if arg == "-" {
            return Some(Program::named("python"));
        }
        if let Some(long) = arg.strip_prefix("--") {
            // CPython's only long option with a separate value.
            if long == "check-hash-based-pycs" {
                i += 1;
            }
            continue;
        }
        let Some(flags) = arg.strip_prefix('-') else {
            return Some(script(arg, &rest[i..], env));
        };
        for (at, flag) in flags.char_indices() {
            if !matches!(flag, 'c' | 'm' | 'W' | 'X') {
                continue;
            }
            let attached = &flags[at + flag.len_utf8()..];
            let value = if attached.is_empty() {
                i += 1;
                rest.get(i - 1).copied()
            } else {
                Some(attached)
            };
            match flag {
                'c' => return Some(Program::named("python")),
                'm' => return Some(module(value?, &rest[i.min(rest.len())..], env)),
                _ => break,
            }
        }
    }
    match rest.get(i) {
        Some(&"-") | None => Some(Program::named("python")),
        Some(&path) => Some(script(path, &rest[i + 1..], env)),
    }
}

fn module(name: &str, args: &[&str], env: &Environ) -> Program {
    match launcher(name) {
        Some(l) => run_by(l, args, env),
        None => Program::named(name),
    }
}

fn script(path: &str, args: &[&str], env: &Environ) -> Program {
    let file = basename(path);
    // Django's per-project script runs Django's launcher.
    let command = if file == "manage.py" {
        "django-admin"
    } else {
        file
    };
    if let Some(l) = launcher(command) {
        return run_by(l, args, env);
    }
    let stem = file
        .strip_suffix(".py")
        .or_else(|| file.strip_suffix(".pyz"))
        .unwrap_or(file);
    Program::named(if stem.is_empty() { file } else { stem })
}

fn not_python(argv0: &str, rest: &[&str], env: &Environ) -> Program {
    // A rewritten title is one argument with spaces; split it like a command line. Its
    // bracketed words are what the program put there to say what it runs (`[app:app]`).
    let words: Vec<&str> = if rest.is_empty() {
        argv0.split_whitespace().take(MAX_ARGS).collect()
    } else {
        std::iter::once(argv0).chain(rest.iter().copied()).collect()
    };
    let (first, args) = words.split_first().unwrap_or((&argv0, &[]));
    let name = basename(first.trim_start_matches('[').trim_end_matches([':', ']']));
    let bracketed: Vec<&str> = args
        .iter()
        .filter_map(|w| w.strip_prefix('[')?.strip_suffix(']'))
        .collect();
    let args = if bracketed.is_empty() {
        args
    } else {
        &bracketed[..]
    };
    match launcher(name) {
        Some(l) => run_by(l, args, env),
        None => Program::named(name),
    }
}

fn run_by(launcher: &'static Launcher, args: &[&str], env: &Environ) -> Program {
    let app = app_argument(launcher, args).or_else(|| {
        launcher
            .app_env
            .and_then(|get| get(env))
            .and_then(app_module)
    });
    let name = match app {
        Some(app) if launcher.top_package => app.split('.').next().unwrap_or(&app).to_string(),
        Some(app) => app,
        None => launcher.name.to_string(),
    };
    Program {
        name,
        launcher: Some(launcher.name),
    }
}

/// The application named in a launcher's arguments: an app option's value, else the first
/// positional `module:attr`, else the first positional module name.
fn app_argument(launcher: &Launcher, args: &[&str]) -> Option<String> {
    let mut bare = None;
    let mut with_attr = None;
    let mut i = 0;
    while let Some(&arg) = args.get(i) {
        i += 1;
        if arg == "--" {
            break;
        }
        if arg.starts_with('-') && arg.len() > 1 {
            for &opt in launcher.app_options {
                let value = if arg == opt {
                    i += 1;
                    args.get(i - 1).copied()
                } else if let Some(v) = arg.strip_prefix(opt) {
                    // `--app=proj`; a short option may also be glued on: `-Aproj`. A longer
                    // option that merely starts alike (`--app-dir`) is not this one.
                    if opt.starts_with("--") {
                        v.strip_prefix('=')
                    } else {
                        Some(v.strip_prefix('=').unwrap_or(v))
                    }
                } else {
                    None
                };
                if let Some(module) = value.and_then(app_module) {
                    return Some(module);
                }
            }
            if !arg.contains('=') && launcher.value_options.contains(&arg) {
                i += 1;
            }
            continue;
        }
        if !launcher.positional_app {
            continue;
        }
        let Some(module) = app_module(arg) else {
            continue;
        };
        if arg.contains(':') {
            with_attr.get_or_insert(module);
        } else {
            bare.get_or_insert(module);
        }
    }
    with_attr.or(bare)
}

/// The module an application spec names: `pkg.mod:attr` and `pkg.mod:factory()` → `pkg.mod`,
/// `path/to/hello.py` → `hello`; `None` for anything else (`0.0.0.0:8000`, `4`).
fn app_module(spec: &str) -> Option<String> {
    let spec = spec.trim();
    if spec.ends_with(".py") || spec.contains('/') {
        let file = basename(spec.split(':').next().unwrap_or(spec));
        let stem = file.strip_suffix(".py").unwrap_or(file);
        return is_dotted_identifier(stem).then(|| cap(stem, MAX_DERIVED_VALUE));
    }
    let module = spec.split(':').next().unwrap_or(spec);
    is_dotted_identifier(module).then(|| cap(module, MAX_DERIVED_VALUE))
}

fn is_dotted_identifier(s: &str) -> bool {
    !s.is_empty()
        && s.split('.').all(|part| {
            let mut chars = part.chars();
            chars
                .next()
                .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        })
}

/// `python`, `python3`, `python3.12`, `python3.13t`, `python3.12d`, `python3-dbg`, …
fn is_python(name: &str) -> bool {
    let Some(rest) = name.strip_prefix("python") else {
        return false;
    };
    let rest = rest
        .strip_suffix("-dbg")
        .or_else(|| rest.strip_suffix("-debug"))
        .unwrap_or(rest);
    rest.chars()
        .all(|c| c.is_ascii_digit() || matches!(c, '.' | 't' | 'd' | 'm' | 'u'))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Environ {
        let mut bytes = Vec::new();
        for (k, v) in pairs {
            bytes.extend_from_slice(format!("{k}={v}\0").as_bytes());
        }
        Environ::parse(&bytes, false)
    }

    fn program(cmd: &str) -> String {
        program_with(cmd, &Environ::default())
    }

    fn program_with(cmd: &str, env: &Environ) -> String {
        let argv: Vec<&str> = cmd.split(' ').collect();
        program_from_argv(&argv, env).unwrap().name
    }

    #[test]
    fn scripts_and_modules() {
        assert_eq!(program("python app.py"), "app");
        assert_eq!(
            program("/usr/bin/python3.12 /srv/shop/server.py --port 80"),
            "server"
        );
        assert_eq!(program("python3 -m mypkg.server"), "mypkg.server");
        assert_eq!(program("python3 -mhttp.server 8000"), "http.server");
        assert_eq!(program("python -c print(1)"), "python");
        assert_eq!(program("python3.13t"), "python");
        assert_eq!(program("python3 -"), "python");
        assert_eq!(program("python3 -i"), "python");
        assert_eq!(program("python3 app.pyz"), "app");
        assert_eq!(program("python3 /srv/mydir/"), "mydir");
    }

    #[test]
    fn interpreter_options_are_skipped() {
        assert_eq!(program("python3 -u app.py"), "app");
        assert_eq!(program("python3 -X dev -W ignore -O app.py"), "app");
        assert_eq!(program("python3 -Xdev -Wignore -OO -uB app.py"), "app");
        assert_eq!(program("python3 -uX importtime app.py"), "app");
        assert_eq!(program("python3 -I -s -S -E -b -q -v app.py"), "app");
        assert_eq!(program("python3 -u -m mypkg"), "mypkg");
        assert_eq!(program("python3 -um mypkg"), "mypkg");
        assert_eq!(
            program("python3 --check-hash-based-pycs always app.py"),
            "app"
        );
        assert_eq!(program("python3 -- -weird.py"), "-weird");
        // -c ends the options: what follows is the command's, not a script.
        assert_eq!(program("python3 -c import(x) app.py"), "python");
        // A missing value is not a panic.
        assert_eq!(
            program_from_argv(&["python3", "-m"], &Environ::default()),
            None
        );
        assert_eq!(program("python3 -W"), "python");
    }

    #[test]
    fn launchers() {
        assert_eq!(
            program("/venv/bin/python3 /venv/bin/gunicorn app:app"),
            "app"
        );
        assert_eq!(
            program("python3 /venv/bin/gunicorn -w 4 -k uvicorn.workers.UvicornWorker -b 0.0.0.0:8000 shop.main:app"),
            "shop.main"
        );
        assert_eq!(
            program("python3 /venv/bin/gunicorn -k gevent mysite.wsgi"),
            "mysite.wsgi"
        );
        assert_eq!(
            program("python3 /venv/bin/gunicorn --bind=:80 app:create_app()"),
            "app"
        );
        assert_eq!(program("python3 /venv/bin/gunicorn"), "gunicorn");
        assert_eq!(
            program("python3 /venv/bin/uvicorn main:app --host 0.0.0.0 --port 80"),
            "main"
        );
        assert_eq!(
            program("python3 -m uvicorn --port 80 api.main:app"),
            "api.main"
        );
        assert_eq!(
            program("python3 /usr/bin/hypercorn -b :80 module:app"),
            "module"
        );
        assert_eq!(
            program("python3 /usr/bin/daphne -b 0.0.0.0 -p 8001 myproject.asgi:application"),
            "myproject.asgi"
        );
        assert_eq!(
            program("python3 /usr/bin/waitress-serve --listen=*:8080 myapp:wsgifunc"),
            "myapp"
        );
        assert_eq!(
            program("python3 -m waitress --port=8080 myapp:wsgifunc"),
            "myapp"
        );
        assert_eq!(
            program("python3 /venv/bin/granian --interface asgi main:app"),
            "main"
        );
        assert_eq!(
            program("python3 /venv/bin/celery -A proj worker -l info"),
            "proj"
        );
        assert_eq!(
            program("python3 /venv/bin/celery --app=proj.celery:app beat"),
            "proj.celery"
        );
        assert_eq!(program("python3 /venv/bin/celery -Aproj worker"), "proj");
        assert_eq!(program("python3 -m celery worker --app proj"), "proj");
        assert_eq!(program("python3 /venv/bin/celery worker"), "celery");
        assert_eq!(program("python3 /venv/bin/flask run"), "flask");
        assert_eq!(program("python3 /venv/bin/flask --app hello run"), "hello");
        assert_eq!(program("python3 -m flask --app src/hello.py run"), "hello");
        let flask_env = env(&[("FLASK_APP", "shop:create_app()")]);
        assert_eq!(
            program_with("python3 /venv/bin/flask run", &flask_env),
            "shop"
        );
        assert_eq!(program("python3 manage.py runserver"), "django");
        assert_eq!(
            program("python3 /srv/manage.py runserver --settings=mysite.settings.prod"),
            "mysite"
        );
        let django_env = env(&[("DJANGO_SETTINGS_MODULE", "mysite.settings")]);
        assert_eq!(
            program_with("python3 manage.py runserver", &django_env),
            "mysite"
        );
        assert_eq!(
            program("python3 /venv/bin/django-admin runserver --settings mysite.settings"),
            "mysite"
        );
        // Any other console script is named by its file.
        assert_eq!(program("/venv/bin/python /venv/bin/mysvc --serve"), "mysvc");
        let found = program_from_argv(
            &["python3", "/venv/bin/gunicorn", "app:app"],
            &Environ::default(),
        );
        assert_eq!(found.unwrap().launcher, Some("gunicorn"));
    }

    #[test]
    fn non_python_argv0() {
        // setproctitle: one argument with spaces.
        assert_eq!(program_with_one("gunicorn: worker [app:app]"), "app");
        assert_eq!(
            program_with_one("gunicorn: master [shop.wsgi:application]"),
            "shop.wsgi"
        );
        assert_eq!(program("/usr/local/bin/uwsgi --ini app.ini"), "uwsgi");
        assert_eq!(program("/opt/frozen/myapp"), "myapp");
        assert_eq!(
            program_with_one("[celeryd: celery@host:MainProcess] -active- (worker -A proj)"),
            "celeryd"
        );
        assert_eq!(
            program_with_one("gunicorn: worker [mysite.wsgi]"),
            "mysite.wsgi"
        );
    }

    fn program_with_one(title: &str) -> String {
        program_from_argv(&[title], &Environ::default())
            .unwrap()
            .name
    }

    #[test]
    fn hostile_command_lines_never_panic() {
        let mut rng = fastrand::Rng::with_seed(7);
        let alphabet: Vec<char> = "-=:/.aAmcWX_0 é\u{0}[]".chars().collect();
        for _ in 0..5000 {
            let argc = rng.usize(0..6);
            let args: Vec<String> = (0..argc)
                .map(|_| {
                    (0..rng.usize(0..8))
                        .map(|_| alphabet[rng.usize(..alphabet.len())])
                        .collect()
                })
                .collect();
            let mut argv: Vec<&str> = args.iter().map(String::as_str).collect();
            if rng.bool() {
                argv.insert(0, "python3");
            }
            let env = Environ::default();
            if let Some(p) = program_from_argv(&argv, &env) {
                assert!(p.name.len() <= MAX_DERIVED_VALUE.max(64));
            }
        }
        let many = vec!["-u"; 10 * MAX_ARGS];
        let mut argv = vec!["python3"];
        argv.extend(many);
        assert_eq!(
            program_from_argv(&argv, &Environ::default()).unwrap().name,
            "python"
        );
    }
}
