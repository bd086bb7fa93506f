//! Nearest-rank percentiles of the run's samples.

/// p50/p99/max (and count) of a sample, in the sample's unit.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Summary {
    /// Number of values.
    pub count: usize,
    /// Median (nearest rank).
    pub p50: f64,
    /// 99th percentile (nearest rank).
    pub p99: f64,
    /// Largest value.
    pub max: f64,
}

impl Summary {
    /// Summarises `values` (NaNs are dropped: they come from nothing we measured).
    pub(crate) fn of(values: &[f64]) -> Summary {
        let mut v: Vec<f64> = values.iter().copied().filter(|x| !x.is_nan()).collect();
        if v.is_empty() {
            return Summary::default();
        }
        v.sort_by(f64::total_cmp);
        Summary {
            count: v.len(),
            p50: percentile(&v, 0.50),
            p99: percentile(&v, 0.99),
            max: v[v.len() - 1],
        }
    }

    /// As JSON (`null` statistics when empty, so consumers don't mistake "none" for 0).
    pub(crate) fn to_json(self) -> serde_json::Value {
        if self.count == 0 {
            return serde_json::json!({"count": 0, "p50": null, "p99": null, "max": null});
        }
        serde_json::json!({"count": self.count, "p50": self.p50, "p99": self.p99, "max": self.max})
    }
}

/// Nearest-rank percentile of sorted, non-empty `v`.
fn percentile(v: &[f64], q: f64) -> f64 {
    let rank = (q * v.len() as f64).ceil() as usize;
    v[rank.clamp(1, v.len()) - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        let s = Summary::of(&v);
        assert_eq!((s.p50, s.p99, s.max), (50.0, 99.0, 100.0));
        assert_eq!(Summary::of(&[]).count, 0);
    }
}
