//! Facts about CPython: layouts per version, and decoding of its objects.

pub mod asyncio;
pub mod code;
pub mod debug_offsets;
pub(crate) mod dicts;
pub mod layout;
pub mod linetable;
pub mod objects;
pub mod tables;
pub(crate) mod thread_names;
pub mod threads;
