//! Loading the prober's and the weeder's config files: read, validated by `dwd_core` (every
//! bad field named), unknown fields logged as warnings.

use std::path::Path;

use tracing::warn;

use crate::{Error, Result};

/// Reads a config file and parses it with `parse`; every bad field is named in the error and
/// unknown fields are logged as warnings.
fn load_config<T>(
    path: &Path,
    parse: impl FnOnce(&str) -> Result<dwd_core::Loaded<T>, dwd_core::ConfigError>,
) -> Result<T> {
    let text = std::fs::read_to_string(path).map_err(|source| Error::ReadConfig {
        path: path.into(),
        source,
    })?;
    let loaded = parse(&text).map_err(|source| Error::Config {
        path: path.into(),
        source,
    })?;
    for warning in &loaded.warnings {
        warn!(file = %path.display(), "{warning}");
    }
    Ok(loaded.config)
}

/// Reads and validates the prober config; every bad field is named in the error.
pub(crate) fn load_prober_config(path: &Path) -> Result<dwd_core::ProberConfig> {
    load_config(path, dwd_core::ProberConfig::from_yaml)
}

/// Reads and validates the weeder config; every bad field is named in the error.
pub(crate) fn load_weeder_config(path: &Path) -> Result<dwd_core::WeederConfig> {
    load_config(path, dwd_core::WeederConfig::from_yaml)
}
