//! Saying a recurring condition once: a loop that fails the same way every cycle logs it the
//! first time and again only when what it says changes, so a stuck condition is one log line,
//! not one a second.

/// Says a recurring condition once, and again only when it changes.
#[derive(Debug, Default)]
pub(crate) struct SaidOnce(Option<String>);

impl SaidOnce {
    /// True the first time `what` is said in a row.
    pub(crate) fn first(&mut self, what: &str) -> bool {
        if self.0.as_deref() == Some(what) {
            return false;
        }
        self.0 = Some(what.to_owned());
        true
    }

    pub(crate) fn clear(&mut self) {
        self.0 = None;
    }
}
