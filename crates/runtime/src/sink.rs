//! Where a generation reports: the [`Sink`] the generation loop calls as it goes (the prompt
//! prefilled, the text as it is decoded, each token's figures, the end). The binary's inline
//! text and its `BMOE_*` progress lines are sinks; so is the `bmoe_metrics` CSV
//! ([`crate::telemetry::CsvSink`]); a server's event stream is another. The events themselves
//! are plain data, in [`crate::events`].

use crate::error::Result;
use crate::events::{Outcome, Prefilled, TokenRow};

/// What a generation reports to, in this order: [`prefilled`](Sink::prefilled) once (not
/// after a cancel during the prefill), then for each generated token its text
/// ([`delta`](Sink::delta), zero or more times) followed by its figures
/// ([`token`](Sink::token), when the runtime takes them), and [`finished`](Sink::finished)
/// once. A sink's error stops the generation and is returned by it.
pub trait Sink {
    /// The prompt was prefilled.
    fn prefilled(&mut self, _p: &Prefilled) -> Result<()> {
        Ok(())
    }

    /// New answer and reasoning text (with `reset`, the whole text so far, replacing what was
    /// delivered: text taken for answer turned out to be reasoning).
    fn delta(&mut self, d: &chat::SplitDelta) -> Result<()>;

    /// A token's figures, once all its text was delivered.
    fn token(&mut self, _row: &TokenRow) -> Result<()> {
        Ok(())
    }

    /// The generation ended (done, stopped by the context or cancelled).
    fn finished(&mut self, _o: &Outcome) -> Result<()> {
        Ok(())
    }

    /// The sink has what it wants (a stop sequence appeared): checked after each token's text,
    /// `true` ends the generation there as an end-of-generation token would (that token is
    /// counted but not run into the context).
    fn stop(&self) -> bool {
        false
    }
}

/// Two sinks fed the same events, the first first.
pub struct Both<A, B>(pub A, pub B);

impl<A: Sink, B: Sink> Sink for Both<A, B> {
    fn prefilled(&mut self, p: &Prefilled) -> Result<()> {
        self.0.prefilled(p)?;
        self.1.prefilled(p)
    }

    fn delta(&mut self, d: &chat::SplitDelta) -> Result<()> {
        self.0.delta(d)?;
        self.1.delta(d)
    }

    fn token(&mut self, row: &TokenRow) -> Result<()> {
        self.0.token(row)?;
        self.1.token(row)
    }

    fn finished(&mut self, o: &Outcome) -> Result<()> {
        self.0.finished(o)?;
        self.1.finished(o)
    }

    fn stop(&self) -> bool {
        self.0.stop() || self.1.stop()
    }
}

impl<S: Sink + ?Sized> Sink for &mut S {
    fn prefilled(&mut self, p: &Prefilled) -> Result<()> {
        (**self).prefilled(p)
    }

    fn delta(&mut self, d: &chat::SplitDelta) -> Result<()> {
        (**self).delta(d)
    }

    fn token(&mut self, row: &TokenRow) -> Result<()> {
        (**self).token(row)
    }

    fn finished(&mut self, o: &Outcome) -> Result<()> {
        (**self).finished(o)
    }

    fn stop(&self) -> bool {
        (**self).stop()
    }
}

impl<S: Sink> Sink for Option<S> {
    fn prefilled(&mut self, p: &Prefilled) -> Result<()> {
        self.as_mut().map_or(Ok(()), |s| s.prefilled(p))
    }

    fn delta(&mut self, d: &chat::SplitDelta) -> Result<()> {
        self.as_mut().map_or(Ok(()), |s| s.delta(d))
    }

    fn token(&mut self, row: &TokenRow) -> Result<()> {
        self.as_mut().map_or(Ok(()), |s| s.token(row))
    }

    fn finished(&mut self, o: &Outcome) -> Result<()> {
        self.as_mut().map_or(Ok(()), |s| s.finished(o))
    }

    fn stop(&self) -> bool {
        self.as_ref().is_some_and(|s| s.stop())
    }
}

/// The text of a generation, collected (what a caller that needs only the answer passes).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Collect {
    pub answer: String,
    pub reasoning: String,
    /// Tokens whose figures were reported.
    pub rows: usize,
}

impl Sink for Collect {
    fn delta(&mut self, d: &chat::SplitDelta) -> Result<()> {
        d.apply(&mut self.answer, &mut self.reasoning);
        Ok(())
    }

    fn token(&mut self, _row: &TokenRow) -> Result<()> {
        self.rows += 1;
        Ok(())
    }
}
