//! The request planner: the reads of a device due at the same time, merged into the fewest
//! Modbus requests.
//!
//! Reads of one table are sorted by address and merged while the request stays within the
//! protocol's limit for that table (125 registers, 2000 bits) and the hole between two reads is
//! at most [`Limits::max_gap`] items: reading a few unused registers costs far less than a
//! round trip (on RS-485 at 9600 baud a request costs about 10 ms of line time before any
//! data). A hole is never bridged over an address the device refused: after an exception for a
//! merged request, the caller marks the hole's addresses as refused and plans again, and each
//! property then fails or succeeds on its own.

use crate::Table;
use std::collections::BTreeSet;

/// One property's read: `count` items of `table` from `address`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Read {
    pub table: Table,
    pub address: u16,
    pub count: u16,
}

impl Read {
    /// One past the last address (as u32: a read may end at 65536).
    fn end(&self) -> u32 {
        u32::from(self.address) + u32::from(self.count)
    }
}

/// One planned request and the reads it answers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    pub table: Table,
    pub address: u16,
    pub count: u16,
    /// Indices into the planned reads.
    pub reads: Vec<usize>,
}

impl Request {
    /// The items of read `r` within an answer to this request.
    pub fn slice<'a, T>(&self, read: &Read, answer: &'a [T]) -> Option<&'a [T]> {
        let from = usize::from(read.address.checked_sub(self.address)?);
        answer.get(from..from + usize::from(read.count))
    }

    /// Addresses this request covers that none of its reads asked for.
    pub fn holes(&self, reads: &[Read]) -> Vec<u16> {
        (u32::from(self.address)..u32::from(self.address) + u32::from(self.count))
            .filter(|a| {
                !self.reads.iter().any(|&i| {
                    reads
                        .get(i)
                        .is_some_and(|r| u32::from(r.address) <= *a && *a < r.end())
                })
            })
            .filter_map(|a| u16::try_from(a).ok())
            .collect()
    }
}

/// How far the planner may merge.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Unrequested items a request may include to join two reads (Telegraf's `max_insert`).
    pub max_gap: u16,
    /// Registers per request, at most (the protocol allows 125; some devices accept fewer).
    pub max_registers: u16,
    /// Bits per request, at most (the protocol allows 2000).
    pub max_bits: u16,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_gap: 10,
            max_registers: Table::HoldingRegister.max_read(),
            max_bits: Table::Coil.max_read(),
        }
    }
}

impl Limits {
    fn max(&self, table: Table) -> u16 {
        let cap = table.max_read();
        if table.is_bits() {
            self.max_bits.clamp(1, cap)
        } else {
            self.max_registers.clamp(1, cap)
        }
    }
}

/// Why a read cannot be planned.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    #[error("read {index} asks for {count} items of {table:?}; one request carries at most {max}")]
    TooLong {
        index: usize,
        table: Table,
        count: u16,
        max: u16,
    },
    #[error("read {index} runs past address 65535")]
    PastEnd { index: usize },
    #[error("read {index} asks for no items")]
    Empty { index: usize },
}

/// Addresses a device refused (an exception for a request that included them as a hole).
pub type Refused = BTreeSet<(Table, u16)>;

/// Plans `reads` into requests. Each read lands in exactly one request; requests are ordered by
/// table and address.
pub fn plan(reads: &[Read], limits: &Limits, refused: &Refused) -> Result<Vec<Request>, PlanError> {
    for (index, r) in reads.iter().enumerate() {
        if r.count == 0 {
            return Err(PlanError::Empty { index });
        }
        if r.end() > 65536 {
            return Err(PlanError::PastEnd { index });
        }
        let max = limits.max(r.table);
        if r.count > max {
            return Err(PlanError::TooLong {
                index,
                table: r.table,
                count: r.count,
                max,
            });
        }
    }
    let mut order: Vec<usize> = (0..reads.len()).collect();
    order.sort_by_key(|&i| (reads[i].table, reads[i].address, reads[i].count));
    let mut out: Vec<Request> = Vec::new();
    let mut end = 0u32;
    for i in order {
        let r = reads[i];
        if let Some(cur) = out.last_mut()
            && cur.table == r.table
            && joins(cur, end, &r, limits, refused)
        {
            end = end.max(r.end());
            cur.count = (end - u32::from(cur.address)) as u16;
            cur.reads.push(i);
            continue;
        }
        end = r.end();
        out.push(Request {
            table: r.table,
            address: r.address,
            count: r.count,
            reads: vec![i],
        });
    }
    Ok(out)
}

/// Whether read `r` may join the request `cur` (which ends before `end`).
fn joins(cur: &Request, end: u32, r: &Read, limits: &Limits, refused: &Refused) -> bool {
    let start = u32::from(cur.address);
    let new_end = end.max(r.end());
    if new_end - start > u32::from(limits.max(r.table)) {
        return false;
    }
    let from = u32::from(r.address);
    if from <= end {
        return true; // adjacent or overlapping: no hole
    }
    if from - end > u32::from(limits.max_gap) {
        return false;
    }
    // The hole [end, from) must hold no refused address.
    !refused
        .range((r.table, end as u16)..(r.table, r.address))
        .any(|_| true)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hr(address: u16, count: u16) -> Read {
        Read {
            table: Table::HoldingRegister,
            address,
            count,
        }
    }

    fn shape(reqs: &[Request]) -> Vec<(Table, u16, u16)> {
        reqs.iter().map(|r| (r.table, r.address, r.count)).collect()
    }

    #[test]
    fn adjacent_and_overlapping_reads_share_a_request() {
        let reads = [hr(0, 2), hr(2, 2), hr(3, 1), hr(4, 4)];
        let p = plan(&reads, &Limits::default(), &Refused::new()).expect("plans");
        assert_eq!(shape(&p), vec![(Table::HoldingRegister, 0, 8)]);
        assert_eq!(p[0].reads.len(), 4);
        let answer: Vec<u16> = (100..108).collect();
        assert_eq!(p[0].slice(&reads[2], &answer), Some(&[103u16][..]));
    }

    #[test]
    fn small_gaps_are_filled_and_large_ones_split() {
        let reads = [hr(0, 1), hr(5, 1), hr(100, 1)];
        let limits = Limits {
            max_gap: 10,
            ..Limits::default()
        };
        let p = plan(&reads, &limits, &Refused::new()).expect("plans");
        assert_eq!(
            shape(&p),
            vec![
                (Table::HoldingRegister, 0, 6),
                (Table::HoldingRegister, 100, 1)
            ]
        );
        assert_eq!(p[0].holes(&reads), vec![1, 2, 3, 4]);
        let strict = Limits {
            max_gap: 0,
            ..Limits::default()
        };
        assert_eq!(
            plan(&reads, &strict, &Refused::new()).expect("plans").len(),
            3
        );
    }

    #[test]
    fn requests_respect_the_protocol_limits() {
        // 200 consecutive single registers: 125 + 75.
        let reads: Vec<Read> = (0..200).map(|a| hr(a, 1)).collect();
        let p = plan(&reads, &Limits::default(), &Refused::new()).expect("plans");
        assert_eq!(
            shape(&p),
            vec![
                (Table::HoldingRegister, 0, 125),
                (Table::HoldingRegister, 125, 75)
            ]
        );
        // 3000 coils: 2000 + 1000.
        let coils: Vec<Read> = (0..3000)
            .map(|a| Read {
                table: Table::Coil,
                address: a,
                count: 1,
            })
            .collect();
        let p = plan(&coils, &Limits::default(), &Refused::new()).expect("plans");
        assert_eq!(
            shape(&p),
            vec![(Table::Coil, 0, 2000), (Table::Coil, 2000, 1000)]
        );
        // A device that takes at most 16 registers per request.
        let small = Limits {
            max_registers: 16,
            ..Limits::default()
        };
        let p = plan(&reads[..40], &small, &Refused::new()).expect("plans");
        assert_eq!(
            p.iter().map(|r| r.count).collect::<Vec<_>>(),
            vec![16, 16, 8]
        );
    }

    #[test]
    fn tables_are_never_mixed() {
        let reads = [
            hr(0, 1),
            Read {
                table: Table::InputRegister,
                address: 1,
                count: 1,
            },
            hr(1, 1),
        ];
        let p = plan(&reads, &Limits::default(), &Refused::new()).expect("plans");
        assert_eq!(
            shape(&p),
            vec![(Table::InputRegister, 1, 1), (Table::HoldingRegister, 0, 2)]
        );
    }

    #[test]
    fn a_refused_hole_is_not_bridged_again() {
        let reads = [hr(0, 1), hr(5, 1)];
        let mut refused = Refused::new();
        let p = plan(&reads, &Limits::default(), &refused).expect("plans");
        assert_eq!(p.len(), 1);
        // The device answered IllegalDataAddress: mark the hole and plan again.
        for a in p[0].holes(&reads) {
            refused.insert((Table::HoldingRegister, a));
        }
        let p = plan(&reads, &Limits::default(), &refused).expect("plans");
        assert_eq!(
            shape(&p),
            vec![
                (Table::HoldingRegister, 0, 1),
                (Table::HoldingRegister, 5, 1)
            ]
        );
    }

    #[test]
    fn impossible_reads_are_errors_that_name_the_read() {
        let e = plan(
            &[hr(0, 1), hr(10, 126)],
            &Limits::default(),
            &Refused::new(),
        );
        assert_eq!(
            e,
            Err(PlanError::TooLong {
                index: 1,
                table: Table::HoldingRegister,
                count: 126,
                max: 125
            })
        );
        assert_eq!(
            plan(&[hr(65535, 2)], &Limits::default(), &Refused::new()),
            Err(PlanError::PastEnd { index: 0 })
        );
        assert_eq!(
            plan(&[hr(1, 0)], &Limits::default(), &Refused::new()),
            Err(PlanError::Empty { index: 0 })
        );
        // The last register is fine.
        assert!(plan(&[hr(65535, 1)], &Limits::default(), &Refused::new()).is_ok());
    }

    proptest::proptest! {
        #[test]
        fn every_read_is_covered_once_within_limits(
            raw in proptest::collection::vec((0u16..400, 1u16..8, 0u8..2), 1..60),
            max_gap in 0u16..20,
        ) {
            let reads: Vec<Read> = raw.iter().map(|&(a, c, t)| Read {
                table: if t == 0 { Table::HoldingRegister } else { Table::Coil },
                address: a,
                count: c,
            }).collect();
            let limits = Limits { max_gap, ..Limits::default() };
            let p = plan(&reads, &limits, &Refused::new()).expect("valid reads");
            let mut seen = vec![0; reads.len()];
            for req in &p {
                proptest::prop_assert!(req.count <= req.table.max_read());
                for &i in &req.reads {
                    seen[i] += 1;
                    let r = reads[i];
                    proptest::prop_assert_eq!(r.table, req.table);
                    proptest::prop_assert!(r.address >= req.address);
                    proptest::prop_assert!(r.end() <= u32::from(req.address) + u32::from(req.count));
                }
            }
            proptest::prop_assert!(seen.iter().all(|&n| n == 1));
            // Never more requests than reads, and never more than one-per-read planning.
            proptest::prop_assert!(p.len() <= reads.len());
        }
    }
}
