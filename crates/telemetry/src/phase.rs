//! The `phase` column every trace format shares.

/// Which forward pass wrote a row: the `phase` column of every trace (0 prefill, 1 decode).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Phase {
    /// `phase=0`: the prompt, many tokens in one batched pass.
    Prefill,
    /// `phase=1`: one generated token per step.
    Decode,
}

impl Phase {
    /// The `phase` column of every trace format (0 prefill, 1 decode).
    pub fn code(self) -> u8 {
        match self {
            Phase::Prefill => 0,
            Phase::Decode => 1,
        }
    }

    /// The phase of a `phase` column value, if it is one (0 or 1).
    pub fn from_code(code: u8) -> Option<Phase> {
        match code {
            0 => Some(Phase::Prefill),
            1 => Some(Phase::Decode),
            _ => None,
        }
    }
}
