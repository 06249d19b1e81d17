//! The expert-use history file (`.coli_usage`) against colibri's contract: the engine-id hash,
//! compatibility with the old `fscanf("%d %d %u")` reader loop, the header checks and their
//! messages, the IKU1 layout, decay and the atomic save.
//!
//! Expected hash values and message texts are the ones recorded from colibri's
//! `route_trace.h` (hash values computed there with the FNV-1a rule and checked against the
//! published FNV-1a vector for "a").

use std::path::{Path, PathBuf};

use store::usage::{self, ReadOutcome, Usage, UsageError};

/// Six layers, eight experts; layers 0 and 4 are dense.
const N_LAYERS: u32 = 6;
const N_EXPERTS: u32 = 8;
const MOE: [u32; 4] = [1, 2, 3, 5];

fn empty() -> Usage {
    Usage::new(N_LAYERS, N_EXPERTS, &MOE)
}

fn sample() -> Usage {
    let mut u = empty();
    assert!(u.add(1, 0, 5));
    assert!(u.add(1, 7, 1));
    assert!(u.add(3, 2, 3_000_000_000)); // above INT_MAX: the count field is unsigned
    assert!(u.add(5, 4, 12));
    assert!(u.add(5, 4, 2));
    u
}

fn write(dir: &Path, name: &str, contents: &[u8]) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, contents).unwrap();
    p
}

fn counts(u: &Usage) -> Vec<((u32, u32), u64)> {
    u.iter().collect()
}

// ---------------------------------------------------------------------------------------------
// The old reader loop, ported literally:
//
//     while (fscanf(f, "%d %d %u", &l, &e, &cnt) == 3)
//         if (l >= 0 && ...) admit(l, e, cnt);
//
// Each conversion skips white space, takes an optional sign and at least one decimal digit;
// the white space in the format matches any amount (also none). A conversion that finds no
// digit makes fscanf return fewer than 3, which ends the loop.
// ---------------------------------------------------------------------------------------------

struct OldReader<'a> {
    s: &'a [u8],
    i: usize,
}

impl OldReader<'_> {
    fn conversion(&mut self) -> Option<i64> {
        while self.i < self.s.len() && b" \t\n\r\x0b\x0c".contains(&self.s[self.i]) {
            self.i += 1;
        }
        let mut neg = false;
        if self.i < self.s.len() && (self.s[self.i] == b'-' || self.s[self.i] == b'+') {
            neg = self.s[self.i] == b'-';
            self.i += 1;
        }
        let start = self.i;
        let mut v: i64 = 0;
        while self.i < self.s.len() && self.s[self.i].is_ascii_digit() {
            v = v * 10 + i64::from(self.s[self.i] - b'0');
            self.i += 1;
        }
        if self.i == start {
            return None;
        }
        Some(if neg { -v } else { v })
    }

    /// `fscanf(f, "%d %d %u", &l, &e, &cnt) == 3`.
    fn fscanf3(&mut self) -> Option<(i32, i32, u32)> {
        let l = self.conversion()?;
        let e = self.conversion()?;
        let c = self.conversion()?;
        Some((l as i32, e as i32, c as u32))
    }
}

/// Every triple the old loop parses, in order (before its `l >= 0` guard).
fn old_loop(bytes: &[u8]) -> Vec<(i32, i32, u32)> {
    let mut r = OldReader { s: bytes, i: 0 };
    std::iter::from_fn(|| r.fscanf3()).collect()
}

/// The records the old loop admits (its `l >= 0` guard).
fn old_admitted(bytes: &[u8]) -> Vec<(i32, i32, u32)> {
    old_loop(bytes).into_iter().filter(|r| r.0 >= 0).collect()
}

#[test]
fn engine_id_is_fnv1a_32() {
    assert_eq!(usage::engine_id(""), 0x811C_9DC5);
    assert_eq!(usage::engine_id("a"), 0xe40c_292c);
    assert_eq!(usage::engine_id("glm_moe_dsa"), 3_815_245_270);
    assert_eq!(usage::engine_id("inkling"), 2_050_583_463);
    assert_eq!(usage::engine_id("olmoe"), 3_841_822_045);
    assert_eq!(usage::engine_id("kimi_k3"), 1_820_578_806);
    assert_eq!(usage::FORMAT_VERSION, 1);
}

#[test]
fn engine_name_shares_olmoe_with_colibri() {
    assert_eq!(usage::engine_name("olmoe"), "olmoe");
    assert_eq!(usage::engine_name("qwen3moe"), "sluice_qwen3moe");
}

#[test]
fn counts_only_moe_layers_and_experts_in_range() {
    let mut u = empty();
    assert!(!u.add(0, 1, 3), "dense layer");
    assert!(!u.add(4, 1, 3), "dense layer");
    assert!(!u.add(6, 1, 3), "past the layers");
    assert!(!u.add(1, 8, 3), "past the experts");
    assert!(u.add(1, 1, 0));
    assert_eq!((u.selections(), u.distinct()), (0, 0));
    assert!(u.add(2, 3, 4));
    assert!(u.add(1, 1, u64::MAX));
    assert!(u.add(1, 1, 5));
    assert_eq!(u.count(1, 1), u64::MAX, "saturates");
    assert_eq!(u.count(0, 1), 0);
    assert_eq!(u.distinct(), 2);
    assert_eq!(u.selections(), u64::MAX);
    assert_eq!(counts(&u), vec![((1, 1), u64::MAX), ((2, 3), 4)]);
}

#[test]
fn saved_file_reads_the_same_in_the_old_loop() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(".coli_usage");
    let mut u = sample();
    let msg = usage::save(&path, &mut u, "olmoe", 1.0).unwrap();
    assert_eq!(
        msg,
        format!(
            "[STATS] 3000000020 selections across 4 distinct experts -> {}",
            path.display()
        )
    );
    let bytes = std::fs::read(&path).unwrap();
    let text = std::str::from_utf8(&bytes).unwrap();
    assert_eq!(text, u.to_text("olmoe"));
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[0], "-1 6 8");
    // The olmoe id is above INT_MAX: it must sit in the third (unsigned) field.
    assert!(usage::engine_id("olmoe") > i32::MAX as u32);
    assert_eq!(lines[1], format!("-2 1 {}", usage::engine_id("olmoe")));
    for line in &lines {
        let fields: Vec<&str> = line.split(' ').collect();
        assert_eq!(fields.len(), 3, "line {line:?}");
        // The first two fields are %d in old readers: they must fit an int.
        for f in &fields[..2] {
            f.parse::<i32>().unwrap();
        }
        fields[2].parse::<u32>().unwrap();
    }
    assert!(text.ends_with('\n'));

    // The old loop skips both header records and admits exactly our records.
    let all = old_loop(&bytes);
    assert_eq!(all.len(), lines.len(), "every line is one record");
    assert_eq!(all[0], (-1, 6, 8));
    assert_eq!(all[1], (-2, 1, usage::engine_id("olmoe")));
    let admitted: Vec<((u32, u32), u64)> = old_admitted(&bytes)
        .into_iter()
        .map(|(l, e, c)| ((l as u32, e as u32), u64::from(c)))
        .collect();
    assert_eq!(admitted, counts(&u));
}

#[test]
fn counts_above_u32_are_saved_saturated() {
    let mut u = empty();
    u.add(2, 1, u64::from(u32::MAX) + 10);
    let text = u.to_text("x");
    assert_eq!(text.lines().nth(2), Some("2 1 4294967295"));
}

#[test]
fn old_loop_emulation_reproduces_the_four_field_desync() {
    // The contract's example: a four-field record leaves its fourth field behind, and the old
    // loop fabricates a record from it and the start of the next line.
    let file = b"3 2 5\n-3 7 12 99\n4 1 8\n";
    assert_eq!(old_loop(file), vec![(3, 2, 5), (-3, 7, 12), (99, 4, 1)]);
    assert_eq!(old_admitted(file), vec![(3, 2, 5), (99, 4, 1)]);

    // Our reader is the same loop: it sees the same invented record, and refuses to credit
    // it because layer 99 is outside the model.
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), "u", file);
    let mut u = empty();
    let r = usage::read_into(&path, &mut u, "x", &[], false).unwrap();
    assert_eq!(
        r,
        ReadOutcome::Loaded {
            accepted: 1,
            notice: None
        }
    );
    assert_eq!(counts(&u), vec![((3, 2), 5)]);
}

#[test]
fn round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(".coli_usage");
    let mut u = sample();
    usage::save(&path, &mut u, "sluice_qwen3moe", 1.0).unwrap();
    let mut back = empty();
    let r = usage::read_into(&path, &mut back, "sluice_qwen3moe", &[], false).unwrap();
    assert_eq!(
        r,
        ReadOutcome::Loaded {
            accepted: 4,
            notice: None
        }
    );
    assert_eq!(back, u);
    // Reading adds to what is there.
    usage::read_into(&path, &mut back, "sluice_qwen3moe", &[], false).unwrap();
    assert_eq!(back.count(5, 4), 28);
    assert_eq!(back.count(3, 2), 6_000_000_000);
}

#[test]
fn missing_and_empty_files_are_no_history() {
    let dir = tempfile::tempdir().unwrap();
    let mut u = empty();
    let r = usage::read_into(&dir.path().join("nope"), &mut u, "x", &[], false).unwrap();
    assert_eq!(r, ReadOutcome::Missing);
    let path = write(dir.path(), "empty", b"");
    let r = usage::read_into(&path, &mut u, "x", &[], false).unwrap();
    assert_eq!(r, ReadOutcome::Missing);
    assert_eq!(u, empty());
}

#[test]
fn empty_history_is_a_zero_byte_file_and_save_leaves_no_tmp() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(".coli_usage");
    std::fs::write(&path, "1 1 1\n").unwrap();
    let mut u = empty();
    assert_eq!(u.to_text("x"), "");
    let msg = usage::save(&path, &mut u, "x", 1.0).unwrap();
    assert_eq!(
        msg,
        format!(
            "[STATS] 0 selections across 0 distinct experts -> {}",
            path.display()
        )
    );
    assert_eq!(std::fs::metadata(&path).unwrap().len(), 0);

    // A save replaces the file in place; only the file itself is left.
    let mut u = sample();
    usage::save(&path, &mut u, "x", 1.0).unwrap();
    usage::save(&path, &mut u, "x", 1.0).unwrap();
    let names: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, vec![std::ffi::OsString::from(".coli_usage")]);
    assert_eq!(std::fs::read_to_string(&path).unwrap(), u.to_text("x"));

    // Decay that takes every count to zero saves a zero-byte file too.
    let mut u = empty();
    u.add(1, 1, 1);
    usage::save(&path, &mut u, "x", 0.25).unwrap();
    assert_eq!(u.distinct(), 0);
    assert_eq!(std::fs::metadata(&path).unwrap().len(), 0);
}

#[test]
fn decay_rounds_half_up_and_drops_zeros() {
    let mut u = empty();
    for (e, c) in [(0, 1), (1, 2), (2, 3), (3, 5), (4, 7), (5, 1000)] {
        u.add(1, e, c);
    }
    // floor(c * 0.5 + 0.5): 1→1, 2→1, 3→2, 5→3, 7→4, 1000→500.
    let mut half = u.clone();
    half.decay(0.5);
    assert_eq!(
        counts(&half),
        vec![
            ((1, 0), 1),
            ((1, 1), 1),
            ((1, 2), 2),
            ((1, 3), 3),
            ((1, 4), 4),
            ((1, 5), 500)
        ]
    );
    // floor(c * 0.4 + 0.5): 1→0 (gone), 2→1, 3→1, 5→2, 7→3, 1000→400.
    let mut d = u.clone();
    d.decay(0.4);
    assert_eq!(
        counts(&d),
        vec![
            ((1, 1), 1),
            ((1, 2), 1),
            ((1, 3), 2),
            ((1, 4), 3),
            ((1, 5), 400)
        ]
    );
    assert_eq!(d.distinct(), 5);

    // Decay is applied at save, before writing.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("u");
    let mut s = u.clone();
    let msg = usage::save(&path, &mut s, "x", 0.5).unwrap();
    assert_eq!(s, half);
    assert!(msg.starts_with("[STATS] 511 selections across 6 distinct experts -> "));
    assert_eq!(std::fs::read_to_string(&path).unwrap(), half.to_text("x"));
}

#[test]
fn decay_of_one_or_more_is_byte_identical() {
    let dir = tempfile::tempdir().unwrap();
    let u = sample();
    let mut files = Vec::new();
    for (i, d) in [1.0, 1.5, f64::NAN].into_iter().enumerate() {
        let path = dir.path().join(format!("u{i}"));
        let mut s = u.clone();
        usage::save(&path, &mut s, "olmoe", d).unwrap();
        assert_eq!(s, u);
        files.push(std::fs::read(&path).unwrap());
    }
    assert_eq!(files[0], u.to_text("olmoe").into_bytes());
    assert_eq!(files[1], files[0]);
    assert_eq!(files[2], files[0]);
}

#[test]
fn decay_from_env_parses_like_atof() {
    assert_eq!(usage::decay_from_env(None), 1.0);
    assert_eq!(usage::decay_from_env(Some("0.99")), 0.99);
    assert_eq!(usage::decay_from_env(Some("0.5x")), 0.5);
    assert_eq!(usage::decay_from_env(Some("  .25")), 0.25);
    assert_eq!(usage::decay_from_env(Some("5e-1")), 0.5);
    assert_eq!(usage::decay_from_env(Some("0x0.8")), 0.5);
    assert_eq!(usage::decay_from_env(Some("1")), 1.0);
    assert_eq!(usage::decay_from_env(Some("abc")), 1.0, "atof gives 0");
    assert_eq!(usage::decay_from_env(Some("")), 1.0);
    assert_eq!(usage::decay_from_env(Some("-1")), 1.0);
    assert_eq!(usage::decay_from_env(Some("0")), 1.0);
    assert_eq!(usage::decay_from_env(Some("2")), 1.0);
    assert_eq!(usage::decay_from_env(Some("1.0000001")), 1.0);
    assert_eq!(usage::decay_from_env(Some("inf")), 1.0);
    assert_eq!(usage::decay_from_env(Some("nan")), 1.0);
}

#[test]
fn legacy_headerless_history_is_accepted() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), "legacy", b"1 2 3\n5 7 4000000000\n\n2 0 1");
    let mut u = empty();
    let r = usage::read_into(&path, &mut u, "glm_moe_dsa", &[], false).unwrap();
    assert_eq!(
        r,
        ReadOutcome::Loaded {
            accepted: 3,
            notice: None
        }
    );
    assert_eq!(
        counts(&u),
        vec![((1, 2), 3), ((2, 0), 1), ((5, 7), 4_000_000_000)]
    );
}

#[test]
fn matching_headers_and_future_records_are_accepted() {
    let dir = tempfile::tempdir().unwrap();
    let id = usage::engine_id("olmoe");
    let text = format!("-1 6 8\n-2 1 {id}\n-3 7 12\n-9 0 0\n1 2 3\n-2 0 {id}\n3 1 2\n");
    let path = write(dir.path(), "u", text.as_bytes());
    let mut u = empty();
    let r = usage::read_into(&path, &mut u, "olmoe", &[], false).unwrap();
    assert_eq!(
        r,
        ReadOutcome::Loaded {
            accepted: 2,
            notice: None
        }
    );
    assert_eq!(counts(&u), vec![((1, 2), 3), ((3, 1), 2)]);
}

#[test]
fn dimension_mismatch_is_refused_even_trusted() {
    let dir = tempfile::tempdir().unwrap();
    let id = usage::engine_id("olmoe");
    let path = write(
        dir.path(),
        "u",
        format!("-1 7 8\n-2 1 {id}\n1 1 1\n").as_bytes(),
    );
    let expected = format!(
        "[USAGE] {}: history is 7 layers x 8 experts, this engine is 6 x 8 — refusing rather than misreading it",
        path.display()
    );
    for trusted in [false, true] {
        let mut u = sample();
        let r = usage::read_into(&path, &mut u, "olmoe", &[], trusted).unwrap();
        assert_eq!(r, ReadOutcome::Refused(expected.clone()));
        assert_eq!(u, sample(), "unchanged");
    }
    // The experts count is checked too, and a mismatch after data records still refuses.
    let path = write(dir.path(), "v", b"1 1 1\n-1 6 9\n");
    let mut u = empty();
    let r = usage::read_into(&path, &mut u, "olmoe", &[], true).unwrap();
    assert_eq!(
        r,
        ReadOutcome::Refused(format!(
            "[USAGE] {}: history is 6 layers x 9 experts, this engine is 6 x 8 — refusing rather than misreading it",
            path.display()
        ))
    );
    assert_eq!(u, empty());
}

#[test]
fn newer_format_is_refused_even_trusted() {
    let dir = tempfile::tempdir().unwrap();
    let id = usage::engine_id("olmoe");
    let path = write(
        dir.path(),
        "u",
        format!("-1 6 8\n-2 2 {id}\n1 1 1\n").as_bytes(),
    );
    let expected = format!(
        "[USAGE] {}: format version 2, this build reads 1 — refusing rather than misreading it",
        path.display()
    );
    for trusted in [false, true] {
        let mut u = empty();
        let r = usage::read_into(&path, &mut u, "olmoe", &[], trusted).unwrap();
        assert_eq!(r, ReadOutcome::Refused(expected.clone()));
        assert_eq!(u, empty());
    }
}

/// Every trusted read of another engine's history is in this one test: the notice is given
/// once per process, so another test doing such a read could take it first.
#[test]
fn foreign_engine_refused_untrusted_and_honoured_once_trusted() {
    let dir = tempfile::tempdir().unwrap();
    let mut kimi = sample();
    let path = dir.path().join(".coli_usage");
    usage::save(&path, &mut kimi, "kimi_k3", 1.0).unwrap();

    let mut u = empty();
    let r = usage::read_into(&path, &mut u, "glm_moe_dsa", &[], false).unwrap();
    assert_eq!(
        r,
        ReadOutcome::Refused(format!(
            "[USAGE] {}: written by kimi_k3, this engine is glm_moe_dsa — refusing (pass PIN=<path> to use it anyway)",
            path.display()
        ))
    );
    assert_eq!(u, empty());

    // A writer outside the known names is unknown, unless the caller names it.
    let ours = dir.path().join("ours");
    usage::save(&ours, &mut sample(), "sluice_qwen3moe", 1.0).unwrap();
    let r = usage::read_into(&ours, &mut u, "olmoe", &[], false).unwrap();
    assert_eq!(
        r,
        ReadOutcome::Refused(format!(
            "[USAGE] {}: written by an unknown engine, this engine is olmoe — refusing (pass PIN=<path> to use it anyway)",
            ours.display()
        ))
    );
    let r = usage::read_into(
        &ours,
        &mut u,
        "olmoe",
        &["sluice_a", "sluice_qwen3moe"],
        false,
    )
    .unwrap();
    assert_eq!(
        r,
        ReadOutcome::Refused(format!(
            "[USAGE] {}: written by sluice_qwen3moe, this engine is olmoe — refusing (pass PIN=<path> to use it anyway)",
            ours.display()
        ))
    );
    assert_eq!(u, empty());

    // Trusted: honoured, with the three-line notice the first time.
    let r = usage::read_into(&path, &mut u, "glm_moe_dsa", &[], true).unwrap();
    assert_eq!(
        r,
        ReadOutcome::Loaded {
            accepted: 4,
            notice: Some(format!(
                "[USAGE] {}: written by kimi_k3, this engine is glm_moe_dsa\n        — honouring it because you named it explicitly\n          (placement only; expert ids do not transfer between engines)",
                path.display()
            ))
        }
    );
    assert_eq!(u, kimi);

    // Not again in this process.
    let mut v = empty();
    let r = usage::read_into(&ours, &mut v, "olmoe", &[], true).unwrap();
    assert_eq!(
        r,
        ReadOutcome::Loaded {
            accepted: 4,
            notice: None
        }
    );
    assert_eq!(v, sample());

    // A trusted IKU1 in another engine is read (its counts, MoE layers only).
    let mut cells = vec![0u32; (N_LAYERS * N_EXPERTS) as usize];
    cells[(N_EXPERTS + 3) as usize] = 9; // layer 1, expert 3
    cells[(4 * N_EXPERTS + 1) as usize] = 4; // layer 4: dense, not credited
    cells[(5 * N_EXPERTS + 7) as usize] = 2; // layer 5, expert 7
    let iku = write(dir.path(), "iku", &iku1(N_LAYERS, N_EXPERTS, &cells));
    let mut w = empty();
    let r = usage::read_into(&iku, &mut w, "olmoe", &[], true).unwrap();
    assert_eq!(
        r,
        ReadOutcome::Loaded {
            accepted: 2,
            notice: None
        }
    );
    assert_eq!(counts(&w), vec![((1, 3), 9), ((5, 7), 2)]);
}

/// An IKU1 history: magic, dims, then the given cells (u32 LE each).
fn iku1(n_layers: u32, n_experts: u32, cells: &[u32]) -> Vec<u8> {
    let mut b = Vec::new();
    for w in [0x3155_4B49, n_layers, n_experts].iter().chain(cells) {
        b.extend_from_slice(&w.to_le_bytes());
    }
    b
}

#[test]
fn iku1_refused_by_name_untrusted() {
    let dir = tempfile::tempdir().unwrap();
    let cells = vec![1u32; (N_LAYERS * N_EXPERTS) as usize];
    let bytes = iku1(N_LAYERS, N_EXPERTS, &cells);
    assert_eq!(&bytes[..4], b"IKU1");
    let path = write(dir.path(), "iku", &bytes);
    let mut u = empty();
    let r = usage::read_into(&path, &mut u, "olmoe", &[], false).unwrap();
    assert_eq!(
        r,
        ReadOutcome::Refused(format!(
            "[USAGE] {}: written by inkling, this engine is olmoe — refusing (pass PIN=<path> to use it anyway)",
            path.display()
        ))
    );
    assert_eq!(u, empty());
}

#[test]
fn iku1_dimension_mismatch_is_refused_trusted() {
    let dir = tempfile::tempdir().unwrap();
    let cells = vec![1u32; (N_LAYERS * 4) as usize];
    let path = write(dir.path(), "iku", &iku1(N_LAYERS, 4, &cells));
    let mut u = empty();
    let r = usage::read_into(&path, &mut u, "olmoe", &[], true).unwrap();
    assert_eq!(
        r,
        ReadOutcome::Refused(format!(
            "[USAGE] {}: history is 6 layers x 4 experts, this engine is 6 x 8 — refusing rather than misreading it",
            path.display()
        ))
    );
    assert_eq!(u, empty());
}

#[test]
fn iku1_read_by_its_own_engine_and_truncation_names_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let mut cells = vec![0u32; (N_LAYERS * N_EXPERTS) as usize];
    cells[(2 * N_EXPERTS) as usize] = 3_000_000_000; // layer 2, expert 0
    cells[1] = 7; // layer 0: dense
    let bytes = iku1(N_LAYERS, N_EXPERTS, &cells);
    let path = write(dir.path(), "iku", &bytes);
    let mut u = empty();
    let r = usage::read_into(&path, &mut u, "inkling", &[], false).unwrap();
    assert_eq!(
        r,
        ReadOutcome::Loaded {
            accepted: 1,
            notice: None
        }
    );
    assert_eq!(counts(&u), vec![((2, 0), 3_000_000_000)]);

    for len in [6, bytes.len() - 1] {
        let short = write(dir.path(), "short", &bytes[..len]);
        let mut u = empty();
        let err = usage::read_into(&short, &mut u, "inkling", &[], true).unwrap_err();
        assert!(matches!(err, UsageError::Truncated { .. }), "{err}");
        assert!(err.to_string().contains(&short.display().to_string()));
        assert_eq!(u, empty());
    }
}

#[test]
fn records_outside_the_moe_layers_are_not_accepted_nor_counted() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(
        dir.path(),
        "u",
        b"0 1 5\n4 1 5\n6 1 5\n1 8 5\n1 -1 5\n2147483647 0 5\n1 2 5\n",
    );
    let mut u = empty();
    let r = usage::read_into(&path, &mut u, "x", &[], false).unwrap();
    assert_eq!(
        r,
        ReadOutcome::Loaded {
            accepted: 1,
            notice: None
        }
    );
    assert_eq!(counts(&u), vec![((1, 2), 5)]);
    assert_eq!(u.selections(), 5);
}

#[test]
fn a_non_number_stops_the_read_like_fscanf() {
    let dir = tempfile::tempdir().unwrap();
    for (file, expect) in [
        (&b"1 2 3\n2 3 4\nx 5 6\n3 1 1\n"[..], 2),
        (&b"1 2 3\n2 3 abc\n3 1 1\n"[..], 1),
        (&b"1 2 3\n2 3 4\n- 1 1\n3 1 1\n"[..], 2),
        (&b"1 2 3\n2 3 4 garbage 3 1 1\n"[..], 2),
        // No separator needed between conversions: "2-3" is 2 then -3 (a negative expert).
        (&b"1 2 3 2-3 4 3 1 1\n"[..], 2),
    ] {
        let path = write(dir.path(), "u", file);
        let mut u = empty();
        let r = usage::read_into(&path, &mut u, "x", &[], false).unwrap();
        let old: Vec<_> = old_admitted(file)
            .into_iter()
            .filter(|&(l, e, _)| l >= 0 && e >= 0 && u.accepts(l as u32, e as u32))
            .collect();
        assert_eq!(old.len(), expect, "{}", String::from_utf8_lossy(file));
        assert_eq!(
            r,
            ReadOutcome::Loaded {
                accepted: expect as u64,
                notice: None
            },
            "{}",
            String::from_utf8_lossy(file)
        );
        let ours: Vec<_> = old
            .iter()
            .map(|&(l, e, c)| ((l as u32, e as u32), u64::from(c)))
            .collect();
        assert_eq!(counts(&u), ours);
    }
}

#[test]
fn unwritable_location_is_an_error_naming_the_path() {
    let dir = tempfile::tempdir().unwrap();
    // The parent is a regular file: no one can write there.
    let file = write(dir.path(), "plain", b"");
    let path = file.join(".coli_usage");
    let err = usage::save(&path, &mut sample(), "x", 1.0).unwrap_err();
    assert!(matches!(err, UsageError::Io { .. }));
    assert!(
        err.to_string().contains(&path.display().to_string()),
        "{err}"
    );

    // A read-only directory: an error exactly when the process cannot create files there
    // (a privileged process can).
    use std::os::unix::fs::PermissionsExt;
    let ro = dir.path().join("ro");
    std::fs::create_dir(&ro).unwrap();
    std::fs::set_permissions(&ro, std::fs::Permissions::from_mode(0o555)).unwrap();
    let probe = std::fs::write(ro.join("probe"), b"").is_ok();
    let _ = std::fs::remove_file(ro.join("probe"));
    let path = ro.join(".coli_usage");
    let r = usage::save(&path, &mut sample(), "x", 1.0);
    match (probe, r) {
        (false, Err(err)) => {
            assert!(
                err.to_string().contains(&path.display().to_string()),
                "{err}"
            );
            assert!(!path.exists());
        }
        (true, Ok(_)) => assert!(path.exists()),
        (probe, r) => panic!("writable {probe}, save gave {r:?}"),
    }
    std::fs::set_permissions(&ro, std::fs::Permissions::from_mode(0o755)).unwrap();
}

#[test]
fn a_path_too_long_for_colibri_is_not_saved() {
    let dir = tempfile::tempdir().unwrap();
    let mut base = dir.path().to_path_buf();
    // Nest directories until a file name of 100..200 bytes reaches 2095 bytes in all.
    while 2095 - base.as_os_str().len() - 1 > 200 {
        base.push("d".repeat(100));
        std::fs::create_dir(&base).unwrap();
    }
    let room = 2095 - base.as_os_str().len() - 1;

    // 2095 + ".tmp" = 2099 bytes: fits the 2100-byte buffer with its terminator.
    let fits = base.join("u".repeat(room));
    assert_eq!(fits.as_os_str().len(), 2095);
    let msg = usage::save(&fits, &mut sample(), "x", 1.0).unwrap();
    assert!(msg.starts_with("[STATS] 3000000020 selections"), "{msg}");
    assert!(fits.exists());

    let long = base.join("u".repeat(room + 1));
    let mut u = sample();
    let msg = usage::save(&long, &mut u, "x", 0.5).unwrap();
    assert_eq!(
        msg,
        format!("[STATS] path too long, not saved: {}", long.display())
    );
    assert!(!long.exists());
    let mut tmp = long.as_os_str().to_os_string();
    tmp.push(".tmp");
    assert!(!Path::new(&tmp).exists());
    // The decay was applied all the same.
    assert_eq!(u.count(5, 4), 7);
}
