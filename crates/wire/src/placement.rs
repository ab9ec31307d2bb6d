//! Where a service process runs ([`Placement`]), read from Linux's `/proc`, and whether two
//! processes compete for the same cores.

pub use crate::pb::Placement;

impl Placement {
    /// This process's placement; fields Linux does not tell (other systems) stay empty.
    pub fn of_this_process() -> Self {
        let read = |path: &str| {
            std::fs::read_to_string(path)
                .map(|text| text.trim().to_owned())
                .unwrap_or_default()
        };
        let cpus = read("/proc/self/status")
            .lines()
            .find_map(|line| line.strip_prefix("Cpus_allowed_list:"))
            .map(|list| list.trim().to_owned())
            .unwrap_or_default();
        Self {
            machine_id: read("/proc/sys/kernel/random/boot_id"),
            hostname: read("/proc/sys/kernel/hostname"),
            cpus,
        }
    }

    /// Whether processes placed at `self` and `other` may run on the same cores: `Some(false)`
    /// on different machines or disjoint CPU sets, `Some(true)` on one machine with a CPU in
    /// common, `None` when either does not say.
    pub fn shares_cores_with(&self, other: &Placement) -> Option<bool> {
        if self.machine_id.is_empty() || other.machine_id.is_empty() {
            return None;
        }
        if self.machine_id != other.machine_id {
            return Some(false);
        }
        let (Some(mine), Some(theirs)) = (cpu_list(&self.cpus), cpu_list(&other.cpus)) else {
            // One machine, CPUs not said: assume they are shared, the common case.
            return Some(true);
        };
        Some(
            mine.iter()
                .any(|&(lo, hi)| theirs.iter().any(|&(a, b)| lo <= b && a <= hi)),
        )
    }
}

/// The inclusive ranges of a Linux CPU list ("0-3,8"); `None` when empty or malformed.
fn cpu_list(list: &str) -> Option<Vec<(u32, u32)>> {
    if list.is_empty() {
        return None;
    }
    list.split(',')
        .map(|part| {
            let part = part.trim();
            match part.split_once('-') {
                Some((lo, hi)) => {
                    let (lo, hi) = (lo.parse().ok()?, hi.parse().ok()?);
                    (lo <= hi).then_some((lo, hi))
                }
                None => part.parse().ok().map(|cpu| (cpu, cpu)),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(machine_id: &str, cpus: &str) -> Placement {
        Placement {
            machine_id: machine_id.into(),
            hostname: String::new(),
            cpus: cpus.into(),
        }
    }

    #[test]
    fn cpu_lists_parse_ranges_and_single_cpus() {
        assert_eq!(cpu_list("0-3,8"), Some(vec![(0, 3), (8, 8)]));
        assert_eq!(cpu_list("5"), Some(vec![(5, 5)]));
        assert_eq!(cpu_list(""), None);
        assert_eq!(cpu_list("3-1"), None);
        assert_eq!(cpu_list("a"), None);
    }

    #[test]
    fn cores_are_shared_only_on_one_machine_with_a_cpu_in_common() {
        assert_eq!(
            at("m", "0-1").shares_cores_with(&at("m", "1-3")),
            Some(true)
        );
        assert_eq!(at("m", "0").shares_cores_with(&at("m", "1")), Some(false));
        assert_eq!(
            at("m", "0-7").shares_cores_with(&at("n", "0-7")),
            Some(false)
        );
        assert_eq!(at("m", "").shares_cores_with(&at("m", "0")), Some(true));
        assert_eq!(at("", "0").shares_cores_with(&at("m", "0")), None);
    }

    #[test]
    fn this_process_has_a_placement_on_linux() {
        let here = Placement::of_this_process();
        if cfg!(target_os = "linux") {
            assert!(!here.machine_id.is_empty());
            assert!(cpu_list(&here.cpus).is_some(), "{:?}", here.cpus);
            assert_eq!(here.shares_cores_with(&here), Some(true));
        }
    }
}
