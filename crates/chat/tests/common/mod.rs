//! Shared functions of the chat tests: the fixture locations and a SHA-256 for the template check.
#![allow(dead_code)]

use std::path::PathBuf;

/// crates/chat/tests/fixtures
pub fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests")
        .join("fixtures")
}

/// The template collection fetched by scripts/fetch_text_fixtures.sh.
pub fn templates_dir() -> PathBuf {
    testdata::text_dir().join("templates")
}

/// The bytes of one fetched template, `name` without `.jinja`.
pub fn template_bytes(name: &str) -> Vec<u8> {
    let path = testdata::template_path(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

pub fn template_source(name: &str) -> String {
    String::from_utf8(template_bytes(name)).expect("template is UTF-8")
}

#[allow(unused_imports)]
pub use testdata::sha256_hex;
