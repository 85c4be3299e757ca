//! Reading a YAML config file into a typed struct, with the path of a wrong key in the error
//! (`modules.edgeHub.qps: invalid type ...`), so that a user sees which line to fix.

use serde::de::DeserializeOwned;
use std::path::{Path, PathBuf};

/// Why a config file could not be used. Names the file and, for a bad value, the key.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("failed to read config file {file}: {source}")]
    Read {
        file: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("config file {file}: key `{key}`: {message}")]
    Invalid {
        file: PathBuf,
        key: String,
        message: String,
    },
}

impl ConfigError {
    /// A value that parsed but is not acceptable, at `key` of `file`.
    pub fn invalid(file: &Path, key: impl Into<String>, message: impl Into<String>) -> Self {
        ConfigError::Invalid {
            file: file.to_path_buf(),
            key: key.into(),
            message: message.into(),
        }
    }
}

/// Reads `file`; returns its text and the directory relative paths in it are relative to.
pub fn read(file: &Path) -> Result<(String, PathBuf), ConfigError> {
    let text = std::fs::read_to_string(file).map_err(|source| ConfigError::Read {
        file: file.to_path_buf(),
        source,
    })?;
    let base = file.parent().unwrap_or(Path::new(".")).to_path_buf();
    Ok((text, base))
}

/// A program's config file: parsed from text, read from a path, or the embedded defaults.
pub trait ConfigFile: Sized {
    /// Parses config text; `file` only names it in errors, relative paths start at `base`.
    fn parse_text(text: &str, file: &Path, base: &Path) -> Result<Self, ConfigError>;

    /// Reads a config file; relative paths in it are relative to its directory.
    fn load(file: &Path) -> Result<Self, ConfigError> {
        let (text, base) = read(file)?;
        Self::parse_text(&text, file, &base)
    }

    /// The config of `file` when one is given, else the defaults (an empty file).
    fn load_or_defaults(file: Option<&Path>) -> Result<Self, ConfigError> {
        match file {
            Some(f) => Self::load(f),
            None => Self::parse_text("", Path::new("(defaults)"), Path::new(".")),
        }
    }
}

/// Parses config `text` (`file` only names it in errors); empty text is `T::default()`.
pub fn parse<T: DeserializeOwned + Default>(text: &str, file: &Path) -> Result<T, ConfigError> {
    if text.trim().is_empty() {
        return Ok(T::default());
    }
    let de = serde_yaml_ng::Deserializer::from_str(text);
    serde_path_to_error::deserialize(de)
        .map_err(|e| ConfigError::invalid(file, e.path().to_string(), e.into_inner().to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Default, serde::Deserialize, PartialEq)]
    #[serde(rename_all = "camelCase", deny_unknown_fields)]
    struct Outer {
        #[serde(default)]
        inner: Inner,
    }

    #[derive(Debug, Default, serde::Deserialize, PartialEq)]
    #[serde(rename_all = "camelCase", deny_unknown_fields)]
    struct Inner {
        #[serde(default)]
        max_count: u32,
    }

    #[test]
    fn a_wrong_value_is_named_by_its_key_and_file() {
        let e =
            parse::<Outer>("inner:\n  maxCount: many\n", Path::new("x.yaml")).expect_err("refused");
        let text = e.to_string();
        assert!(
            text.starts_with("config file x.yaml: key `inner.maxCount`: ")
                && text.contains("invalid type: string \"many\""),
            "{text}"
        );
    }

    #[test]
    fn empty_text_is_the_defaults() {
        assert_eq!(
            parse::<Outer>(" \n", Path::new("x")).ok(),
            Some(Outer::default())
        );
        assert_eq!(
            parse::<Outer>("inner: {maxCount: 3}", Path::new("x")).ok(),
            Some(Outer {
                inner: Inner { max_count: 3 }
            })
        );
    }

    #[test]
    fn an_unreadable_file_is_named() {
        let e = read(Path::new("/nonexistent/edgecore.yaml")).expect_err("missing");
        assert!(
            e.to_string()
                .starts_with("failed to read config file /nonexistent/edgecore.yaml"),
            "{e}"
        );
    }
}
