//! Facts about CPython: layouts per version, and decoding of its objects.

pub mod layout;
pub mod linetable;
