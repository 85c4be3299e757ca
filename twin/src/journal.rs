//! The journal's records: what one committed batch changed, as post-images of rows.
//!
//! A batch is appended to the journal as one row (its records, JSON-encoded), which is one
//! sequential write however many devices it touched. The fold later replays records in order into
//! [`Pending`], which coalesces them (the last image of a row wins, a removal drops what came
//! before it) so the tables are written once per row, in key order.

use crate::engine::Applied;
use crate::model::{DeviceRow, OutboxEntry, PropertyTwin};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;

/// The record of one applied operation, borrowed from it for encoding.
#[derive(Serialize)]
pub(crate) struct RecordRef<'a> {
    /// The device id, `{namespace}/{name}`.
    d: String,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    rm: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    row: Option<&'a DeviceRow>,
    /// Properties and their image after the operation (`None`: deleted).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    p: Vec<(&'a str, Option<&'a PropertyTwin>)>,
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    o: &'a [OutboxEntry],
    /// When the batch was committed (ms since the epoch): the time of a device's state change
    /// in its history.
    t: crate::model::Millis,
}

impl<'a> RecordRef<'a> {
    /// The record of `a`, if it touched a device.
    pub(crate) fn of(a: &'a Applied) -> Option<Self> {
        let id = a.device.as_ref()?;
        Some(Self {
            d: id.to_string(),
            rm: a.removed,
            row: if a.removed { None } else { a.row.as_ref() },
            p: if a.removed {
                Vec::new()
            } else {
                a.changes
                    .iter()
                    .map(|c| (c.name.as_str(), c.current.as_ref()))
                    .collect()
            },
            o: if a.removed { &[] } else { &a.outbox },
            t: crate::now_millis(),
        })
    }

    /// Rows this record writes, for the fold's pacing.
    pub(crate) fn weight(&self) -> u64 {
        1 + self.p.len() as u64 + self.o.len() as u64
    }
}

/// A record read back from the journal.
#[derive(Deserialize)]
pub(crate) struct Record {
    d: String,
    #[serde(default)]
    rm: bool,
    #[serde(default)]
    row: Option<DeviceRow>,
    #[serde(default)]
    p: Vec<(String, Option<PropertyTwin>)>,
    #[serde(default)]
    o: Vec<OutboxEntry>,
    /// 0 in records of versions before history.
    #[serde(default)]
    t: crate::model::Millis,
}

impl Record {
    /// The history points of this record: each property's reported value (a property whose
    /// desired value alone changed repeats its reported one, which the history takes once), and
    /// the device's state when it changed.
    pub(crate) fn history(
        &self,
        h: &crate::history::History,
        out: &mut Vec<crate::history::Point>,
    ) {
        if self.rm {
            h.forget(&self.d);
            return;
        }
        for (name, image) in &self.p {
            if let Some(r) = image.as_ref().and_then(|p| p.reported.as_ref()) {
                out.push(crate::history::Point {
                    device: self.d.clone(),
                    property: name.clone(),
                    t: r.timestamp,
                    value: r.value.clone(),
                });
            }
        }
        if let Some(row) = &self.row
            && self.t > 0
            && !row.state.is_empty()
            && h.state_changed(&self.d, &row.state)
        {
            out.push(crate::history::Point {
                device: self.d.clone(),
                property: crate::history::STATE.into(),
                t: self.t,
                value: row.state.clone(),
            });
        }
    }
}

/// Journal records coalesced into the rows to write. Hashed while records are added (most
/// replace a row already there); [`Pending::sorted`] orders each table by key for writing.
#[derive(Default)]
pub(crate) struct Pending {
    /// Devices removed: their rows in every table are deleted before the writes below.
    pub purge: Vec<String>,
    pub rows: HashMap<String, DeviceRow>,
    pub props: HashMap<(String, String), Option<PropertyTwin>>,
    pub outbox: HashMap<(String, String, &'static str), OutboxEntry>,
}

/// The rows of a [`Pending`], each table sorted by key.
pub(crate) struct Sorted<'a> {
    pub purge: &'a [String],
    pub rows: Vec<(&'a String, &'a DeviceRow)>,
    pub props: Vec<(&'a (String, String), &'a Option<PropertyTwin>)>,
    pub outbox: Vec<(&'a (String, String, &'static str), &'a OutboxEntry)>,
}

impl Pending {
    /// Adds a record; returns the rows it carried.
    pub(crate) fn add(&mut self, r: Record) -> u64 {
        let Record {
            d, rm, row, p, o, ..
        } = r;
        if rm {
            self.rows.remove(&d);
            self.props.retain(|(dev, _), _| dev != &d);
            self.outbox.retain(|(dev, _, _), _| dev != &d);
            self.purge.push(d);
            return 1;
        }
        let n = 1 + p.len() as u64 + o.len() as u64;
        for (name, image) in p {
            self.props.insert((d.clone(), name), image);
        }
        for e in o {
            self.outbox
                .insert((d.clone(), e.property.clone(), e.section.as_str()), e);
        }
        if let Some(row) = row {
            self.rows.insert(d, row);
        }
        n
    }

    /// The rows to write, each table in key order (B-tree pages are then written in order,
    /// each once).
    pub(crate) fn sorted(&self) -> Sorted<'_> {
        let mut rows: Vec<_> = self.rows.iter().collect();
        rows.sort_unstable_by(|a, b| a.0.cmp(b.0));
        let mut props: Vec<_> = self.props.iter().collect();
        props.sort_unstable_by(|a, b| a.0.cmp(b.0));
        let mut outbox: Vec<_> = self.outbox.iter().collect();
        outbox.sort_unstable_by(|a, b| a.0.cmp(b.0));
        Sorted {
            purge: &self.purge,
            rows,
            props,
            outbox,
        }
    }
}
