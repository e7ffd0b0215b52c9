//! Native code addresses → function names, with blazesym.
//!
//! Names are cached per (file, file offset), not per process: a function of libc is resolved
//! once for every process that maps libc, wherever ASLR put it. A miss asks the blazesym
//! resolver the [`FileCache`](super::modules::FileCache) keeps for the file (ELF symbols, and
//! DWARF where the file or its split debug file has it), so no file is parsed twice. blazesym
//! returns raw names; they are demangled here with the same two crates blazesym itself uses
//! (its own demangling is only reachable through its path-keyed `Symbolizer`, which would
//! re-open the file for every process's `/proc/PID/map_files` path).

use std::sync::Arc;

use blazesym::symbolize::{FindSymOpts, SrcLang, Symbolize as _, TranslateFileOffset as _};
use rustc_hash::{FxHashMap, FxHashSet};

use super::modules::{FileKey, LoadedFile};

/// Cached (file, offset) → name entries; past this the cache starts over (`evictions`).
pub(super) const MAX_SYMBOL_ENTRIES: usize = 1 << 18;

#[derive(Default, Debug, Clone, Copy, serde::Serialize)]
pub(super) struct SymbolStats {
    pub lookups: u64,
    pub hits: u64,
    pub misses: u64,
    pub evictions: u64,
    /// Addresses no symbol covers (or whose file could not be read).
    pub unknown: u64,
    /// blazesym errors (a corrupt symbol table, an unreadable DWARF unit).
    pub errors: u64,
}

#[derive(Default)]
pub(crate) struct Symbols {
    names: FxHashMap<(FileKey, u64), Option<Arc<str>>>,
    /// One allocation per distinct function name, however many offsets fall inside it.
    interned: FxHashSet<Arc<str>>,
    pub stats: SymbolStats,
}

impl Symbols {
    /// The function holding `offset` of file `key`; `file` is asked for only on a miss.
    pub(super) fn name<'f>(
        &mut self,
        key: FileKey,
        offset: u64,
        file: impl FnOnce() -> Option<&'f LoadedFile>,
    ) -> Option<Arc<str>> {
        self.stats.lookups += 1;
        if let Some(hit) = self.names.get(&(key, offset)) {
            self.stats.hits += 1;
            if hit.is_none() {
                self.stats.unknown += 1;
            }
            return hit.clone();
        }
        self.stats.misses += 1;
        let name = file()
            .and_then(|f| self.resolve(f, offset))
            .map(|name| self.intern(name));
        if name.is_none() {
            self.stats.unknown += 1;
        }
        if self.names.len() >= MAX_SYMBOL_ENTRIES {
            self.names.clear();
            self.interned.clear();
            self.stats.evictions += 1;
        }
        self.names.insert((key, offset), name.clone());
        name
    }

    fn resolve(&mut self, file: &LoadedFile, offset: u64) -> Option<String> {
        let resolver = file.symbols.as_ref()?;
        let found = resolver
            .file_offset_to_virt_offset(offset)
            .and_then(|virt| match virt {
                Some(virt) => resolver.find_sym(virt, &FindSymOpts::Basic),
                None => Ok(Err(blazesym::symbolize::Reason::InvalidFileOffset)),
            });
        match found {
            Ok(Ok(sym)) => Some(demangle(sym.name, sym.lang)),
            Ok(Err(_reason)) => None,
            Err(err) => {
                self.stats.errors += 1;
                log::debug!("{} at {offset:#x}: {err}", file.path.display());
                None
            }
        }
    }

    fn intern(&mut self, name: String) -> Arc<str> {
        if let Some(known) = self.interned.get(name.as_str()) {
            return known.clone();
        }
        let name: Arc<str> = Arc::from(name);
        self.interned.insert(name.clone());
        name
    }
}

/// A readable name: Rust and C++ symbols demangled (Rust without its hash suffix), anything
/// else as it is.
fn demangle(name: &str, lang: SrcLang) -> String {
    let rust = || {
        rustc_demangle::try_demangle(name)
            .ok()
            .map(|d| format!("{d:#}"))
    };
    let cpp = || {
        name.starts_with("_Z")
            .then(|| cpp_demangle::Symbol::new(name).ok()?.demangle().ok())
            .flatten()
    };
    match lang {
        SrcLang::Rust => rust(),
        SrcLang::Cpp => cpp(),
        _ => rust().or_else(cpp),
    }
    .unwrap_or_else(|| name.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn demangles() {
        assert_eq!(
            demangle("_ZN4core3fmt5write17h0123456789abcdefE", SrcLang::Unknown),
            "core::fmt::write"
        );
        assert_eq!(
            demangle("_ZNSt6vectorIiSaIiEE9push_backERKi", SrcLang::Unknown),
            "std::vector<int, std::allocator<int> >::push_back(int const&)"
        );
        assert_eq!(demangle("qsort", SrcLang::Unknown), "qsort");
        assert_eq!(demangle("_Z", SrcLang::Cpp), "_Z");
    }
}
