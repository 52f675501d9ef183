//! The memory budget of a multi-model server (`--max-loaded-bytes`): which loaded models to
//! unload so that another one fits. The least recently used go first; a model with requests in
//! flight, or pinned (`keep_alive: -1`), stays. Pure bookkeeping, so it is tested on its own.

use std::time::Instant;

/// A loaded model as the budget sees it.
#[derive(Clone, Debug)]
pub struct Resident {
    /// Its index in the registry.
    pub index: usize,
    /// Bytes it counts for (the size of its files).
    pub bytes: u64,
    /// When a request for it last ended (or began).
    pub last_used: Instant,
    /// Idle and not pinned: it may be unloaded.
    pub evictable: bool,
}

/// Why a model cannot be made to fit.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BudgetError {
    /// The model alone is larger than the budget.
    #[error("it needs {need} bytes, more than the whole budget of {budget} bytes (--max-loaded-bytes)")]
    TooLarge {
        /// The model's bytes.
        need: u64,
        /// The budget.
        budget: u64,
    },
    /// Unloading every idle, unpinned model would still not leave room.
    #[error(
        "it needs {need} bytes and at most {free} of the budget of {budget} bytes (--max-loaded-bytes) can be freed: the other loaded models are busy or pinned"
    )]
    Busy {
        /// The model's bytes.
        need: u64,
        /// What the budget would have left after unloading every evictable model.
        free: u64,
        /// The budget.
        budget: u64,
    },
}

/// The models to unload, least recently used first, so that `need` more bytes fit beside
/// `resident` within `budget`; empty when they fit already.
pub fn plan_eviction(resident: &[Resident], need: u64, budget: u64) -> Result<Vec<usize>, BudgetError> {
    if need > budget {
        return Err(BudgetError::TooLarge { need, budget });
    }
    let fits = |used: u64| used.checked_add(need).is_some_and(|total| total <= budget);
    let mut used: u64 = resident.iter().fold(0u64, |a, r| a.saturating_add(r.bytes));
    let mut candidates: Vec<&Resident> = resident.iter().filter(|r| r.evictable).collect();
    candidates.sort_by_key(|r| r.last_used);
    let mut victims = Vec::new();
    for r in candidates {
        if fits(used) {
            break;
        }
        used = used.saturating_sub(r.bytes);
        victims.push(r.index);
    }
    if fits(used) {
        Ok(victims)
    } else {
        Err(BudgetError::Busy {
            need,
            free: budget.saturating_sub(used),
            budget,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn at(t0: Instant, secs: u64) -> Instant {
        t0 + Duration::from_secs(secs)
    }

    fn r(index: usize, bytes: u64, last_used: Instant, evictable: bool) -> Resident {
        Resident {
            index,
            bytes,
            last_used,
            evictable,
        }
    }

    #[test]
    fn nothing_is_unloaded_when_the_model_fits() {
        let t0 = Instant::now();
        let loaded = [r(0, 40, at(t0, 1), true), r(1, 30, at(t0, 2), true)];
        assert_eq!(plan_eviction(&loaded, 30, 100), Ok(vec![]));
        assert_eq!(plan_eviction(&[], 100, 100), Ok(vec![]));
    }

    #[test]
    fn the_least_recently_used_go_first_and_only_as_many_as_needed() {
        let t0 = Instant::now();
        // Index order is not age order: model 2 is the oldest, then 0, then 1.
        let loaded = [
            r(0, 30, at(t0, 5), true),
            r(1, 30, at(t0, 9), true),
            r(2, 30, at(t0, 1), true),
        ];
        assert_eq!(plan_eviction(&loaded, 20, 100), Ok(vec![2]));
        assert_eq!(plan_eviction(&loaded, 50, 100), Ok(vec![2, 0]));
        assert_eq!(plan_eviction(&loaded, 100, 100), Ok(vec![2, 0, 1]));
    }

    #[test]
    fn busy_and_pinned_models_stay() {
        let t0 = Instant::now();
        // The oldest is busy (or pinned): the next oldest goes instead.
        let loaded = [r(0, 50, at(t0, 1), false), r(1, 40, at(t0, 2), true)];
        assert_eq!(plan_eviction(&loaded, 40, 100), Ok(vec![1]));
        // Even unloading model 1 leaves only 50 bytes free.
        assert_eq!(
            plan_eviction(&loaded, 60, 100),
            Err(BudgetError::Busy {
                need: 60,
                free: 50,
                budget: 100
            })
        );
    }

    #[test]
    fn a_model_larger_than_the_budget_is_refused_whatever_is_loaded() {
        assert_eq!(
            plan_eviction(&[], 101, 100),
            Err(BudgetError::TooLarge { need: 101, budget: 100 })
        );
        let msg = plan_eviction(&[], 101, 100).unwrap_err().to_string();
        assert!(msg.contains("101 bytes") && msg.contains("--max-loaded-bytes"), "{msg}");
    }

    #[test]
    fn sizes_near_the_limit_of_u64_do_not_overflow() {
        let t0 = Instant::now();
        let loaded = [r(0, u64::MAX, at(t0, 1), true)];
        assert_eq!(plan_eviction(&loaded, u64::MAX, u64::MAX), Ok(vec![0]));
    }
}
