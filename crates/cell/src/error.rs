//! The one error type of this crate.

/// What was wrong with a cell or message (encoding or decoding).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CellError {
    /// Input ended before a field was complete.
    #[error("{what}: truncated (needed {needed} more bytes)")]
    Truncated {
        /// What was being parsed.
        what: &'static str,
        /// How many more bytes the field needed.
        needed: usize,
    },
    /// A buffer had the wrong length.
    #[error("{what}: wrong length: expected {expected}, got {got}")]
    WrongLength {
        /// What was being parsed.
        what: &'static str,
        /// Expected length.
        expected: usize,
        /// Actual length.
        got: usize,
    },
    /// Something to encode was larger than its field or container allows.
    #[error("{what}: too long: at most {max} bytes, got {got}")]
    TooLong {
        /// What was being encoded.
        what: &'static str,
        /// The limit.
        max: usize,
        /// Actual size.
        got: usize,
    },
    /// A fixed-size cell carried a variable-length command.
    #[error("command {0} is variable-length but appears in a fixed-size cell")]
    VariableCommandInFixedCell(u8),
    /// A variable-length cell carried a fixed-size command.
    #[error("command {0} is fixed-size but appears in a variable-length cell")]
    FixedCommandInVarCell(u8),
    /// A relay payload's length field was larger than 498.
    #[error("relay length field {0} exceeds 498")]
    BadRelayLength(usize),
    /// A field had a value that is not allowed.
    #[error("{what}: {why}")]
    Invalid {
        /// What was being parsed.
        what: &'static str,
        /// Why it was rejected.
        why: &'static str,
    },
}
