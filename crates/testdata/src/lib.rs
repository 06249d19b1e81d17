//! Test-only helpers shared by the workspace's test suites: the location of the third-party
//! fixtures that `scripts/fetch_text_fixtures.sh` fetches (kept outside the checkout), and a
//! SHA-256 to check that a fixture is the one a reference was made from.
//!
//! Missing fixtures are a test failure that says what to run, never a skip.

use std::path::PathBuf;

/// What to run when the fixtures are missing.
pub const FETCH_HINT: &str = "text fixtures missing: run `bash scripts/fetch_text_fixtures.sh`";

/// The fixture root: `$SLUICE_FIXTURES`, else `${XDG_CACHE_HOME:-$HOME/.cache}/sluice/fixtures`
/// (the same rule as the fetch script).
pub fn fixtures_root() -> PathBuf {
    let non_empty = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
    match non_empty("SLUICE_FIXTURES") {
        Some(root) => PathBuf::from(root),
        None => {
            let cache = non_empty("XDG_CACHE_HOME")
                .map(PathBuf::from)
                .unwrap_or_else(|| {
                    PathBuf::from(non_empty("HOME").unwrap_or_default()).join(".cache")
                });
            cache.join("sluice").join("fixtures")
        }
    }
}

/// The text fixture directory (`<root>/text`); panics with [`FETCH_HINT`] when the fetch has not
/// completed.
pub fn text_dir() -> PathBuf {
    let dir = fixtures_root().join("text");
    assert!(
        dir.join("STAMP").is_file(),
        "{FETCH_HINT} (looked in {})",
        dir.display()
    );
    dir
}

/// A fetched vocabulary file, `text/vocab/<name>` (the name includes `.gguf`).
pub fn vocab_path(name: &str) -> PathBuf {
    existing(text_dir().join("vocab").join(name))
}

/// A fetched chat template, `text/templates/<name>.jinja`.
pub fn template_path(name: &str) -> PathBuf {
    existing(text_dir().join("templates").join(format!("{name}.jinja")))
}

fn existing(path: PathBuf) -> PathBuf {
    assert!(
        path.is_file(),
        "{FETCH_HINT} ({} not found)",
        path.display()
    );
    path
}

/// SHA-256 (FIPS 180-4), hex.
pub fn sha256_hex(data: &[u8]) -> String {
    const K: [u32; 64] = [
        0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4,
        0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe,
        0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f,
        0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7,
        0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc,
        0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b,
        0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116,
        0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
        0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7,
        0xc67178f2,
    ];
    let mut h: [u32; 8] = [
        0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab,
        0x5be0cd19,
    ];
    let mut msg = data.to_vec();
    let bit_len = (data.len() as u64).wrapping_mul(8);
    msg.push(0x80);
    while msg.len() % 64 != 56 {
        msg.push(0);
    }
    msg.extend_from_slice(&bit_len.to_be_bytes());
    for chunk in msg.chunks(64) {
        let mut w = [0u32; 64];
        for (i, word) in chunk.chunks(4).enumerate() {
            w[i] = u32::from_be_bytes([word[0], word[1], word[2], word[3]]);
        }
        for i in 16..64 {
            let s0 = w[i - 15].rotate_right(7) ^ w[i - 15].rotate_right(18) ^ (w[i - 15] >> 3);
            let s1 = w[i - 2].rotate_right(17) ^ w[i - 2].rotate_right(19) ^ (w[i - 2] >> 10);
            w[i] = w[i - 16]
                .wrapping_add(s0)
                .wrapping_add(w[i - 7])
                .wrapping_add(s1);
        }
        let [mut a, mut b, mut c, mut d, mut e, mut f, mut g, mut hh] = h;
        for i in 0..64 {
            let s1 = e.rotate_right(6) ^ e.rotate_right(11) ^ e.rotate_right(25);
            let ch = (e & f) ^ (!e & g);
            let t1 = hh
                .wrapping_add(s1)
                .wrapping_add(ch)
                .wrapping_add(K[i])
                .wrapping_add(w[i]);
            let s0 = a.rotate_right(2) ^ a.rotate_right(13) ^ a.rotate_right(22);
            let maj = (a & b) ^ (a & c) ^ (b & c);
            let t2 = s0.wrapping_add(maj);
            hh = g;
            g = f;
            f = e;
            e = d.wrapping_add(t1);
            d = c;
            c = b;
            b = a;
            a = t1.wrapping_add(t2);
        }
        let v = [a, b, c, d, e, f, g, hh];
        for (x, y) in h.iter_mut().zip(v.iter()) {
            *x = x.wrapping_add(*y);
        }
    }
    h.iter().map(|x| format!("{x:08x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::sha256_hex;

    #[test]
    fn sha256_known_answers() {
        // FIPS 180-4 examples (one block, empty, two blocks) and a message of exactly one block.
        assert_eq!(
            sha256_hex(b""),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        assert_eq!(
            sha256_hex(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(
            sha256_hex(b"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"
        );
    }
}

/// The index of the largest value, the lowest index on ties (llama.cpp's greedy choice).
pub fn argmax(v: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best as u32
}

/// Largest minus second-largest value, in f32, as the reference generators compute the top-2
/// logit gap of a greedy step.
pub fn top2_gap(v: &[f32]) -> f32 {
    let best = argmax(v) as usize;
    let second = v
        .iter()
        .enumerate()
        .filter(|&(i, _)| i != best)
        .map(|(_, &x)| x)
        .fold(f32::NEG_INFINITY, f32::max);
    v[best] - second
}

#[cfg(test)]
mod greedy_tests {
    use super::*;

    #[test]
    fn argmax_takes_the_lowest_index_on_ties_and_the_gap_is_to_the_runner_up() {
        assert_eq!(argmax(&[1.0, 3.0, 3.0, 2.0]), 1);
        assert_eq!(top2_gap(&[1.0, 3.0, 3.0, 2.0]), 0.0);
        assert_eq!(top2_gap(&[0.5, -1.0, 2.0]), 1.5);
    }
}
