//! The libraries never write to the terminal: what they have to say reaches the caller as
//! notices, errors or sink events, so a server or an app that embeds them decides where it
//! goes. Only the binary (`crates/cli`) prints.

use std::path::{Path, PathBuf};

/// What writes to a terminal or ends the process from inside a library.
const FORBIDDEN: &[&str] = &[
    "println!",
    "eprintln!",
    "print!",
    "eprint!",
    "dbg!",
    "io::stdout()",
    "io::stderr()",
    "process::exit",
];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for entry in entries {
        let path = entry.expect("directory entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|x| x == "rs") {
            out.push(path);
        }
    }
}

/// The code of a line with its `//` comment removed (a doc comment may name a macro).
fn code(line: &str) -> &str {
    match line.find("//") {
        Some(i) => &line[..i],
        None => line,
    }
}

fn offences(src: &str) -> Vec<(usize, String)> {
    src.lines()
        .enumerate()
        .filter(|(_, l)| FORBIDDEN.iter().any(|f| code(l).contains(f)))
        .map(|(i, l)| (i + 1, l.trim().to_string()))
        .collect()
}

#[test]
fn the_scan_sees_a_print_and_ignores_one_in_a_comment() {
    assert_eq!(offences("let x = 1;\n    eprintln!(\"{x}\");\n").len(), 1);
    assert_eq!(
        offences("/// like `println!` would\nlet y = 2; // print!\n").len(),
        0
    );
    assert_eq!(offences("let _ = std::io::stdout().lock();").len(), 1);
}

#[test]
fn no_library_crate_writes_to_the_terminal() {
    let crates = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut found = Vec::new();
    let mut scanned = 0;
    for entry in std::fs::read_dir(&crates).expect("crates directory") {
        let dir = entry.expect("crate entry").path();
        let name = dir.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        // The binary is the one place that prints.
        if name == "cli" || !dir.join("src").is_dir() {
            continue;
        }
        let mut files = Vec::new();
        rust_files(&dir.join("src"), &mut files);
        for f in files {
            scanned += 1;
            let src = std::fs::read_to_string(&f).expect("source file");
            for (line, text) in offences(&src) {
                found.push(format!("{}:{line}: {text}", f.display()));
            }
        }
    }
    assert!(
        scanned > 50,
        "only {scanned} library sources found under {}",
        crates.display()
    );
    assert!(
        found.is_empty(),
        "libraries write to the terminal:\n{}",
        found.join("\n")
    );
}
