//! Speculative decoding: draft tokens, verify the group in one pass
//! ([`engine::Engine::forward_rows`]), keep what the model itself samples. Each verified row
//! carries a one-token pass's bits, so the answer is the unspeculated one token for token.
//! Two sources draft: prompt lookup (`--ngram`: the tokens that followed the latest earlier
//! occurrence of the text's last tokens) and the model's NextN head (`--mtp`,
//! [`engine::Engine::mtp_draft`]).

/// What drafts, and how.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Spec {
    /// Prompt lookup (`--ngram`).
    Ngram(Ngram),
    /// The model's NextN head (`--mtp`).
    Mtp(Mtp),
}

impl Spec {
    /// Most tokens drafted per verify pass.
    pub fn draft(&self) -> usize {
        match self {
            Spec::Ngram(n) => n.draft,
            Spec::Mtp(m) => m.draft,
        }
    }

    /// The source's name (the spec's `spec=` value and its lines' prefix).
    pub fn source(&self) -> Source {
        match self {
            Spec::Ngram(_) => Source::Ngram,
            Spec::Mtp(_) => Source::Mtp,
        }
    }
}

/// Which source drafted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Source {
    #[default]
    Ngram,
    Mtp,
}

impl Source {
    /// `ngram` or `mtp`.
    pub fn name(self) -> &'static str {
        match self {
            Source::Ngram => "ngram",
            Source::Mtp => "mtp",
        }
    }
}

/// The NextN head's settings.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Mtp {
    /// Most tokens drafted per verify pass (`--draft`): the head's own hidden state feeds
    /// the drafts after the first.
    pub draft: usize,
    /// Drafting stops at the first draft the head gives a lower probability (`--mtp-p-min`).
    pub p_min: f32,
}

/// The n-gram source's settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ngram {
    /// Most tokens drafted per verify pass (`--draft`).
    pub draft: usize,
    /// Shortest run of matching tokens allowed to draft (`--ngram-min-match`).
    pub min_match: usize,
}

impl Ngram {
    /// `--draft`'s default and the largest value it takes.
    pub const DEFAULT_DRAFT: usize = 3;
    pub const MAX_DRAFT: usize = 8;
    /// `--ngram-min-match`'s default.
    pub const DEFAULT_MIN_MATCH: usize = 3;
    /// Matches are measured up to this many tokens (a longer one is no better a guess).
    pub const MAX_MATCH: usize = 16;
}

impl Default for Ngram {
    fn default() -> Ngram {
        Ngram {
            draft: Ngram::DEFAULT_DRAFT,
            min_match: Ngram::DEFAULT_MIN_MATCH,
        }
    }
}

/// The draft for `corpus` (the prompt, what was generated, and the token just sampled): the
/// tokens that followed the earlier run of tokens ending where the longest suffix of `corpus`
/// (up to [`Ngram::MAX_MATCH`]) recurs, the most recent of the longest; at most `max` of them,
/// up to the corpus end. Nothing when the best match is shorter than `min_match` (or 0).
///
/// Every position strictly before the corpus end is a candidate match end, so the suffix is
/// never matched against itself; a match may overlap it (a run of one repeated token predicts
/// itself).
pub fn ngram_draft(corpus: &[u32], min_match: usize, max: usize) -> &[u32] {
    let n = corpus.len();
    if n < 2 || max == 0 {
        return &[];
    }
    let cap = Ngram::MAX_MATCH;
    let mut best = (0usize, 0usize); // (length, match end)
    // Most recent first: a later end of equal length never replaces an earlier find.
    for end in (1..n).rev() {
        let len = corpus[..end]
            .iter()
            .rev()
            .zip(corpus.iter().rev())
            .take(cap)
            .take_while(|(a, b)| a == b)
            .count();
        if len > best.0 {
            best = (len, end);
            if len == cap {
                break;
            }
        }
    }
    let (len, end) = best;
    if len == 0 || len < min_match {
        return &[];
    }
    &corpus[end..(end + max).min(n)]
}

/// What speculation did over a generation (the spec's `mtp_*` keys, whichever source
/// drafted).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct SpecCounts {
    /// Who drafted.
    pub source: Source,
    /// Tokens drafted.
    pub drafted: u64,
    /// Drafted tokens the model sampled itself (kept).
    pub accepted: u64,
    /// Forward passes of the decode, plain and verifying.
    pub decodes: u64,
    /// Passes that verified a draft.
    pub drafted_steps: u64,
    /// Seconds spent drafting and cutting rejected drafts out of the context (outside the
    /// passes).
    pub draft_s: f64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_longest_match_wins_and_the_most_recent_among_equals() {
        // "1 2 3" recurs at 0 (followed by 9) and at 5 (followed by 8): both length 3
        let c = [1, 2, 3, 9, 0, 1, 2, 3, 8, 7, 1, 2, 3];
        assert_eq!(ngram_draft(&c, 3, 2), &[8, 7]);
        // a longer match earlier wins over a shorter recent one
        let c = [5, 1, 2, 3, 9, 4, 2, 3, 8, 5, 1, 2, 3];
        assert_eq!(ngram_draft(&c, 3, 1), &[9]);
    }

    #[test]
    fn the_gate_and_the_clipping() {
        let c = [1, 2, 3, 4, 1, 2];
        // best match "1 2" has length 2
        assert_eq!(ngram_draft(&c, 3, 3), &[] as &[u32]);
        assert_eq!(ngram_draft(&c, 2, 3), &[3, 4, 1]);
        assert_eq!(ngram_draft(&c, 2, 8), &[3, 4, 1, 2]);
        // nothing recurs
        assert_eq!(ngram_draft(&[1, 2, 3], 1, 3), &[] as &[u32]);
        assert_eq!(ngram_draft(&[7], 1, 3), &[] as &[u32]);
        assert_eq!(ngram_draft(&c, 2, 0), &[] as &[u32]);
    }

    #[test]
    fn a_repeated_token_predicts_itself_and_the_suffix_never_matches_itself() {
        // the match ending at 3 overlaps the suffix: "7 7 7" ends at 3, followed by 7
        let c = [7, 7, 7, 7];
        assert_eq!(ngram_draft(&c, 3, 3), &[7]);
        assert_eq!(ngram_draft(&c, 1, 3), &[7]);
        // the match length is capped: every end of a long run matches as long, and the most
        // recent one leaves one token before the corpus end
        let c = vec![4u32; 40];
        assert_eq!(ngram_draft(&c, 3, 3), &[4]);
    }
}
