//! Writers for aggregated profiles.
