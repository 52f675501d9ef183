//! Error types: surfaces, lowering, and the (emulated) device.

use anelm_mil::{BlobError, BuildError, ParseError};
use thiserror::Error;

use crate::rules::Rule;

/// A surface was addressed outside its shape or filled with the wrong number of values.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum SurfaceError {
    /// A buffer has the wrong length.
    #[error("expected {expected} {what}, got {found}; pass exactly one value per channel")]
    Length {
        /// Required length.
        expected: usize,
        /// Length given.
        found: usize,
        /// What was counted.
        what: &'static str,
    },
    /// More lanes than the surface has.
    #[error("{requested} lanes requested but a surface has {lanes}; split the batch into groups of {lanes}")]
    TooManyLanes {
        /// Lanes asked for.
        requested: usize,
        /// Lanes available.
        lanes: usize,
    },
    /// An element index outside the surface.
    #[error("element (channel {channel}, lane {lane}) is outside a [1, {channels}, 1, {lanes}] surface")]
    OutOfRange {
        /// Channel asked for.
        channel: usize,
        /// Lane asked for.
        lane: usize,
        /// Channels of the surface.
        channels: usize,
        /// Lanes of the surface.
        lanes: usize,
    },
}

/// A kernel could not be lowered to MIL.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum LowerError {
    /// Wrong number of weight matrices for the kernel.
    #[error("kernel {kernel} takes {expected} weight matrices, {found} given; pass them in AneKernel::weights() order")]
    WeightCount {
        /// The kernel.
        kernel: String,
        /// Matrices expected.
        expected: usize,
        /// Matrices given.
        found: usize,
    },
    /// A weight matrix has the wrong number of elements.
    #[error("weight {name} needs {expected} values (rows × cols, row-major), got {found}")]
    WeightShape {
        /// Weight name.
        name: String,
        /// Elements expected.
        expected: usize,
        /// Elements given.
        found: usize,
    },
    /// The int8 block size does not divide the input width.
    #[error("int8 block size {block} does not divide the input width {cols}; pick a divisor or None (per row)")]
    BadBlock {
        /// Requested block.
        block: usize,
        /// Input width.
        cols: usize,
    },
    /// Kernel dimensions are unusable.
    #[error("bad kernel dimensions: {0}")]
    BadDims(String),
    /// The MIL builder refused a statement (a bug in the lowering).
    #[error("MIL construction failed (a lowering bug, please report): {0}")]
    Build(#[from] BuildError),
    /// A weight blob could not be written.
    #[error("weight blob: {0}")]
    Blob(#[from] BlobError),
    /// An internal invariant failed.
    #[error("internal lowering error: {0}")]
    Internal(&'static str),
}

/// The (emulated) ANE refused a program or a call.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum AneError {
    /// The MIL text does not parse (the framework would return a nil descriptor).
    #[error("the ANE compiler cannot parse this MIL text ({0}); emit it with anelm_mil's printer")]
    Parse(#[from] ParseError),
    /// The program parses but is ill-typed or structurally wrong.
    #[error("the MIL program is ill-formed: {0}; fix the emitter so Program::check passes")]
    Invalid(BuildError),
    /// A hardware rule is broken.
    #[error("ANE rule `{rule}` broken: {detail}. Fix: {advice}", advice = rule.advice())]
    Rule {
        /// The rule.
        rule: Rule,
        /// What exactly broke it.
        detail: String,
    },
    /// A handle that this device never issued (or that was released).
    #[error("unknown ANE program handle {0}; compile the program first")]
    UnknownHandle(u64),
    /// A call made in the wrong lifecycle state.
    #[error("cannot {call} program {handle} while it is {state}; the order is compile → load → evaluate → unload")]
    State {
        /// Handle.
        handle: u64,
        /// The call attempted.
        call: &'static str,
        /// The state it was in.
        state: &'static str,
    },
    /// The surfaces passed to evaluate do not match the program's signature.
    #[error("evaluate: {0}")]
    Surfaces(String),
    /// An op could not be executed (an emulator limitation, not a hardware rule).
    #[error("the emulator cannot execute `{value}` ({op}): {message}")]
    Exec {
        /// Op name.
        op: String,
        /// Value being computed.
        value: String,
        /// What went wrong.
        message: String,
    },
    /// The real device is not available on this machine.
    #[error("{0}")]
    Unavailable(String),
    /// The real Neural Engine's framework refused a call (the message carries its NSError).
    #[error("{0}")]
    Framework(String),
}

impl AneError {
    /// The rule this error names, if it is a rule refusal.
    pub fn rule(&self) -> Option<Rule> {
        match self {
            AneError::Rule { rule, .. } => Some(*rule),
            _ => None,
        }
    }

    pub(crate) fn rule_err(rule: Rule, detail: impl Into<String>) -> AneError {
        AneError::Rule {
            rule,
            detail: detail.into(),
        }
    }
}
