//! `cargo xtask fuzz --seeds`: seeds for the parsers of foreign data, taken from the CPython
//! interpreters the tests use (Debian's 3.11, pyenv's 3.11.7/3.12.1/3.13.0, the sid root's
//! 3.13/3.14/3.15).
//!
//! Only what each parser reads is kept, so the checked-in files stay small:
//! - `debug_offsets`: the first `READ_SIZE` (1 KiB) bytes of `.PyRuntime` (3.13+);
//! - `elf`: the ELF header, program headers, section headers and names, and `.dynsym`/`.dynstr`
//!   cut to the symbols pyebpf looks up plus a few dozen others (a libpython is 30 MB);
//! - `linetable`: `co_firstlineno` and `co_linetable` of stdlib functions, printed by each
//!   interpreter itself;
//! - `proc_maps`, `cgroup`, `environ`: the `/proc` files of each interpreter started here with a
//!   known environment (never this machine's own environment: it may hold secrets).

use std::io::{BufRead as _, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{bail, Context as _, Result};
use object::elf::{FileHeader64, SHT_DYNSYM, SHT_NOBITS, SHT_NULL};
use object::read::elf::{FileHeader as _, SectionHeader as _, Sym as _};
use object::Endianness;

use crate::{sidroot, util};

/// `debug_offsets::READ_SIZE`: what the profiler reads of `_PyRuntime`.
const RUNTIME_BYTES: usize = 1024;
/// `.dynsym` entries kept besides the ones pyebpf looks up.
const OTHER_SYMBOLS: usize = 32;
/// The symbols `elf.rs` looks up.
const WANTED: &[&[u8]] = &[
    b"_PyRuntime",
    b"Py_Version",
    b"_PyEval_EvalFrameDefault",
    b"_PyObject_MakeTpCall",
    b"PyObject_Vectorcall",
];

struct Interpreter {
    name: &'static str,
    /// argv to run it.
    command: Vec<String>,
    /// The ELF file holding `_PyRuntime`.
    elf: PathBuf,
    debug_offsets: bool,
    /// The ELF file holding `.AsyncioDebug` (3.14+).
    asyncio: Option<PathBuf>,
}

fn interpreters() -> Vec<Interpreter> {
    let sid = std::env::var_os("PYEBPF_SID_ROOT")
        .filter(|r| !r.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(sidroot::DEFAULT_ROOT));
    let pyenv = |v: &str| {
        let minor = &v[..v.rfind('.').unwrap()];
        let dir = format!("/root/.pyenv/versions/{v}");
        (
            vec![format!("{dir}/bin/python{minor}")],
            PathBuf::from(format!("{dir}/lib/libpython{minor}.so.1.0")),
        )
    };
    let mut all = vec![Interpreter {
        name: "debian-3.11",
        command: vec!["/usr/bin/python3.11".into()],
        elf: "/usr/bin/python3.11".into(),
        debug_offsets: false,
        asyncio: None,
    }];
    for (name, v, offsets) in [
        ("pyenv-3.11.7", "3.11.7", false),
        ("pyenv-3.12.1", "3.12.1", false),
        ("pyenv-3.13.0", "3.13.0", true),
    ] {
        let (command, elf) = pyenv(v);
        all.push(Interpreter {
            name,
            command,
            elf,
            debug_offsets: offsets,
            asyncio: None,
        });
    }
    for (name, minor) in [
        ("sid-3.13", "3.13"),
        ("sid-3.14", "3.14"),
        ("sid-3.15", "3.15"),
    ] {
        all.push(Interpreter {
            name,
            command: vec![
                "chroot".into(),
                sid.display().to_string(),
                format!("python{minor}"),
            ],
            elf: sid.join(format!("usr/bin/python{minor}")),
            debug_offsets: true,
            // Built into sid's 3.15 executable; a lib-dynload module in its 3.14.
            asyncio: match minor {
                "3.14" => Some(sid.join(
                    "usr/lib/python3.14/lib-dynload/_asyncio.cpython-314-x86_64-linux-gnu.so",
                )),
                "3.15" => Some(sid.join("usr/bin/python3.15")),
                _ => None,
            },
        });
    }
    all
}

pub fn generate(dir: &Path) -> Result<()> {
    util::step(&format!(
        "fuzz seeds from real interpreters into {}",
        dir.display()
    ));
    for python in interpreters() {
        eprintln!("{}", python.name);
        let data = std::fs::read(&python.elf)
            .with_context(|| format!("reading {}", python.elf.display()))?;
        let name = python.name;
        if python.debug_offsets {
            write(dir, "debug_offsets", name, &runtime_section(&data)?)?;
        }
        write(dir, "elf", name, &compact_elf(&data, &[])?)?;
        for (i, table) in line_tables(&python.command)?.into_iter().enumerate() {
            write(dir, "linetable", &format!("{name}-{i}"), &table)?;
        }
        if let Some(asyncio) = &python.asyncio {
            let data = std::fs::read(asyncio)?;
            let elf = compact_elf(&data, &[b".AsyncioDebug"])?;
            write(
                dir,
                "asyncio",
                &format!("{name}-section"),
                &section(&data, b".AsyncioDebug")?,
            )?;
            write(dir, "asyncio", &format!("{name}-elf"), &elf)?;
        }
        let proc = proc_files(&python.command)?;
        write(dir, "proc_maps", name, &proc.maps)?;
        write(dir, "cgroup", name, &proc.cgroup)?;
        write(dir, "environ", name, &[&[0u8][..], &proc.environ].concat())?;
        write(
            dir,
            "environ",
            &format!("{name}-cut"),
            &[&[1u8][..], &proc.environ].concat(),
        )?;
    }
    Ok(())
}

fn write(dir: &Path, target: &str, name: &str, bytes: &[u8]) -> Result<()> {
    let dir = dir.join(target);
    std::fs::create_dir_all(&dir)?;
    std::fs::write(dir.join(name), bytes).with_context(|| format!("writing {target}/{name}"))
}

/// The first bytes of the `.PyRuntime` section: `_Py_DebugOffsets`.
fn runtime_section(data: &[u8]) -> Result<Vec<u8>> {
    let mut bytes = section(data, b".PyRuntime")?;
    if bytes.len() < RUNTIME_BYTES {
        bail!(".PyRuntime is cut short");
    }
    bytes.truncate(RUNTIME_BYTES);
    Ok(bytes)
}

/// The contents of the section named `name`.
fn section(data: &[u8], name: &[u8]) -> Result<Vec<u8>> {
    let header = FileHeader64::<Endianness>::parse(data)?;
    let e = header.endian()?;
    let sections = header.sections(e, data)?;
    let (_, section) = sections
        .section_by_name(e, name)
        .with_context(|| format!("no {} section", String::from_utf8_lossy(name)))?;
    Ok(section.data(e, data)?.to_vec())
}

/// The parts of an x86-64 ELF file `elf.rs` reads, re-laid out into a small file: headers,
/// section names, and `.dynsym`/`.dynstr` with the wanted symbols. Every other section keeps
/// its header (name, address) but no contents, except those named in `keep`; the program headers are unchanged, so
/// `_PyRuntime`'s file offset is still computed (and the reads of `Py_Version` and the
/// prologues, beyond the end, fail as on a cut file).
fn compact_elf(data: &[u8], keep: &[&[u8]]) -> Result<Vec<u8>> {
    let header = FileHeader64::<Endianness>::parse(data)?;
    let e = header.endian()?;
    if e != Endianness::Little {
        bail!("only little-endian ELF files");
    }
    let sections = header.sections(e, data)?;
    let (dynsym_index, dynsym) = sections
        .iter()
        .enumerate()
        .find(|(_, s)| s.sh_type(e) == SHT_DYNSYM)
        .context("no .dynsym")?;
    let dynstr_index = dynsym.sh_link(e) as usize;
    let shstrndx = header.e_shstrndx(e) as usize;
    let table = sections.symbols(e, data, SHT_DYNSYM)?;

    let mut symbols = vec![0u8; 24];
    let mut strings = vec![0u8];
    let (mut wanted, mut others) = (0, 0);
    let sym_start = dynsym.sh_offset(e) as usize;
    for (i, sym) in table.symbols().iter().enumerate().skip(1) {
        let name = sym.name(e, table.strings()).unwrap_or_default();
        let keep = if WANTED.contains(&name) {
            wanted += 1;
            true
        } else {
            others += 1;
            others <= OTHER_SYMBOLS
        };
        if !keep {
            continue;
        }
        let mut raw = data[sym_start + 24 * i..sym_start + 24 * (i + 1)].to_vec();
        raw[..4].copy_from_slice(&(strings.len() as u32).to_le_bytes());
        strings.extend_from_slice(name);
        strings.push(0);
        symbols.extend_from_slice(&raw);
    }
    if wanted == 0 && keep.is_empty() {
        bail!("none of the wanted symbols is in .dynsym");
    }
    let shstr = sections.section(object::SectionIndex(shstrndx))?;
    let names = shstr.data(e, data).context("reading .shstrtab")?;

    let phoff = header.e_phoff(e) as usize;
    let phlen = header.e_phnum(e) as usize * header.e_phentsize(e) as usize;
    let mut out = data[..64].to_vec();
    out.extend_from_slice(&data[phoff..phoff + phlen]);
    let place = |out: &mut Vec<u8>, bytes: &[u8]| {
        while !out.len().is_multiple_of(8) {
            out.push(0);
        }
        let at = out.len();
        out.extend_from_slice(bytes);
        (at as u64, bytes.len() as u64)
    };
    let sym_at = place(&mut out, &symbols);
    let str_at = place(&mut out, &strings);
    let names_at = place(&mut out, names);
    let mut kept = Vec::new();
    for (i, s) in sections.iter().enumerate() {
        let name = sections.section_name(e, s).unwrap_or_default();
        if keep.contains(&name) {
            kept.push((
                i,
                place(&mut out, s.data(e, data).context("reading a kept section")?),
            ));
        }
    }
    let shoff = place(&mut out, &[]).0;
    for (i, s) in sections.iter().enumerate() {
        let start = header.e_shoff(e) as usize + i * header.e_shentsize(e) as usize;
        let mut raw = data[start..start + 64].to_vec();
        let (offset, size) = match i {
            _ if i == dynsym_index => sym_at,
            _ if i == dynstr_index => str_at,
            _ if i == shstrndx => names_at,
            _ if kept.iter().any(|&(k, _)| k == i) => {
                kept.iter().find(|&&(k, _)| k == i).unwrap().1
            }
            _ if matches!(s.sh_type(e), SHT_NOBITS | SHT_NULL) => (s.sh_offset(e), s.sh_size(e)),
            _ => (0, 0),
        };
        raw[24..32].copy_from_slice(&offset.to_le_bytes());
        raw[32..40].copy_from_slice(&size.to_le_bytes());
        out.extend_from_slice(&raw);
    }
    out[0x20..0x28].copy_from_slice(&64u64.to_le_bytes());
    out[0x28..0x30].copy_from_slice(&shoff.to_le_bytes());
    Ok(out)
}

/// Prints `co_firstlineno` and `co_linetable` of a few stdlib functions of every shape
/// (a long one, a generator, a method with comprehensions, a small helper).
const LINE_TABLES: &str = r#"
import argparse, inspect, json, json.decoder, os, posixpath, textwrap
for f in [posixpath.relpath, json.dumps, json.decoder.JSONDecoder.raw_decode,
          argparse.ArgumentParser._parse_known_args, inspect.getsourcelines,
          textwrap.TextWrapper._wrap_chunks, os.walk]:
    c = getattr(f, "__code__", None)  # some are C functions in some versions
    if c is not None:
        print(c.co_firstlineno, c.co_linetable.hex())
"#;

fn line_tables(command: &[String]) -> Result<Vec<Vec<u8>>> {
    let out = util::stdout_of(
        Command::new(&command[0])
            .args(&command[1..])
            .args(["-c", LINE_TABLES]),
    )?;
    out.lines()
        .map(|line| {
            let (first, hex) = line.split_once(' ').context("a line table line")?;
            let mut bytes = first.parse::<u32>()?.to_le_bytes().to_vec();
            for i in (0..hex.len()).step_by(2) {
                bytes.push(u8::from_str_radix(&hex[i..i + 2], 16)?);
            }
            Ok(bytes)
        })
        .collect()
}

struct ProcFiles {
    maps: Vec<u8>,
    cgroup: Vec<u8>,
    environ: Vec<u8>,
}

/// `/proc/PID/{maps,cgroup,environ}` of the interpreter, started with only the variables that
/// name a service (and `PATH`), and read once it runs Python code.
fn proc_files(command: &[String]) -> Result<ProcFiles> {
    let mut child = Command::new(&command[0])
        .args(&command[1..])
        .args([
            "-c",
            "import sys; print('ready', flush=True); sys.stdin.read()",
        ])
        .env_clear()
        .env(
            "PATH",
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        )
        .env("OTEL_SERVICE_NAME", "checkout")
        .env(
            "OTEL_RESOURCE_ATTRIBUTES",
            "service.name=cart%2Cv2,deployment.environment=prod",
        )
        .env("PYROSCOPE_APPLICATION_NAME", "shop{env=prod}")
        .env("DJANGO_SETTINGS_MODULE", "shop.settings")
        .env("FLASK_APP", "shop.app:create_app()")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {}", command.join(" ")))?;
    let mut ready = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut ready)?;
    let pid = child.id();
    let read = |file: &str| std::fs::read(format!("/proc/{pid}/{file}"));
    let files = (|| {
        Ok::<_, std::io::Error>(ProcFiles {
            maps: read("maps")?,
            cgroup: read("cgroup")?,
            environ: read("environ")?,
        })
    })();
    drop(child.stdin.take());
    child.wait()?;
    if ready.trim() != "ready" {
        bail!("{} did not start", command.join(" "));
    }
    Ok(files?)
}
