//! What the planner does when a kernel fails to compile or load (ane-runtime.md §2.6, §3.9):
//! the input projection and the output projection must compile (else the model does not load
//! on the ANE); the FFN falls back resadd → plain → chunked; the LM head falls back to the CPU.

use std::fmt;

use crate::plan::KernelRole;

/// The forms an FFN kernel can take, in the order they are tried.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FfnForm {
    /// One kernel computing `x + D(silu(G·x) ⊙ U·x)` (`ffn_resadd`).
    Residual,
    /// One kernel computing `D(silu(G·x) ⊙ U·x)`; the residual add runs on the CPU.
    Plain,
    /// Several chunk kernels with an on-ANE accumulator.
    Chunked,
}

impl FfnForm {
    /// The order of attempts.
    pub const ORDER: [FfnForm; 3] = [FfnForm::Residual, FfnForm::Plain, FfnForm::Chunked];

    /// The form to try after this one failed, if any.
    pub fn next(self) -> Option<FfnForm> {
        match self {
            FfnForm::Residual => Some(FfnForm::Plain),
            FfnForm::Plain => Some(FfnForm::Chunked),
            FfnForm::Chunked => None,
        }
    }
}

impl fmt::Display for FfnForm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            FfnForm::Residual => "resadd",
            FfnForm::Plain => "plain",
            FfnForm::Chunked => "chunked",
        })
    }
}

/// What to do after a kernel of some role failed to compile or load.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fallback {
    /// Build the FFN in this form instead.
    Ffn(FfnForm),
    /// Free every LM-head chunk and run the LM head on the CPU.
    LmHeadOnCpu,
    /// Nothing to fall back to: the model cannot run on the ANE (the message says why).
    Abort(String),
}

/// The fallback after `role` failed; `ffn_form` is the form the failed FFN kernel had (ignored
/// for other roles; an [`KernelRole::FfnChunk`] is always [`FfnForm::Chunked`]).
pub fn fallback(role: &KernelRole, ffn_form: FfnForm) -> Fallback {
    match role {
        KernelRole::InputProj
        | KernelRole::OutputProjResidual
        | KernelRole::OutputProj
        | KernelRole::FfnGateUp
        | KernelRole::FfnDown
        | KernelRole::FfnUp
        | KernelRole::FfnDownResidual => Fallback::Abort(format!(
            "the {role} kernel must run on the Neural Engine and it failed; run with --device cpu"
        )),
        KernelRole::FfnResidual => match ffn_form.next() {
            Some(f) => Fallback::Ffn(f),
            None => Fallback::Abort("every FFN form (resadd, plain, chunked) failed; run with --device cpu".into()),
        },
        KernelRole::FfnChunk { .. } => {
            Fallback::Abort("the chunked FFN (the last FFN form) failed; run with --device cpu".into())
        }
        KernelRole::LmHead { .. } => Fallback::LmHeadOnCpu,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ffn_goes_resadd_plain_chunked_then_gives_up() {
        let role = KernelRole::FfnResidual;
        assert_eq!(fallback(&role, FfnForm::Residual), Fallback::Ffn(FfnForm::Plain));
        assert_eq!(fallback(&role, FfnForm::Plain), Fallback::Ffn(FfnForm::Chunked));
        assert!(matches!(fallback(&role, FfnForm::Chunked), Fallback::Abort(_)));
        let chunk = KernelRole::FfnChunk { index: 1, count: 3 };
        assert!(matches!(fallback(&chunk, FfnForm::Residual), Fallback::Abort(m) if m.contains("chunked")));
        let mut f = Some(FfnForm::ORDER[0]);
        let mut seen = vec![];
        while let Some(x) = f {
            seen.push(x.to_string());
            f = x.next();
        }
        assert_eq!(seen, ["resadd", "plain", "chunked"]);
    }

    #[test]
    fn lm_head_goes_to_cpu_and_projections_abort() {
        assert_eq!(
            fallback(&KernelRole::LmHead { index: 0, count: 3 }, FfnForm::Residual),
            Fallback::LmHeadOnCpu
        );
        for role in [KernelRole::InputProj, KernelRole::OutputProjResidual] {
            match fallback(&role, FfnForm::Residual) {
                Fallback::Abort(m) => assert!(m.contains(&role.to_string()) && m.contains("--device cpu"), "{m}"),
                f => panic!("{role}: {f:?}"),
            }
        }
    }
}
