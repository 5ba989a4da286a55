//! The machine-row writes several SQLite operations share: an update that must find its row,
//! an instance's record, the inserts of new machines and of their constraint sets.

use rusqlite::{params, Connection};

use super::rows::take_counter;
use super::StoreCore;
use crate::model::{Constraints, MachineId, MachineStatus};
use crate::ports::ProvisionedInstance;
use crate::service::store::errors::StoreError;
use crate::service::store::records::{ConstraintRow, NewMachine};

impl StoreCore {
    /// One machine's update; the hot ones (the provisioner's, at every start) stamp
    /// `changed_at` themselves, so that the `machines_stamp_update` trigger (kept for every
    /// other writer) does not write the row a second time.
    pub(super) fn update_machine(
        &self,
        id: &MachineId,
        context: &'static str,
        sql: &str,
        p: &[&dyn rusqlite::ToSql],
    ) -> Result<(), StoreError> {
        let n = self.conn.prepare_cached(sql).and_then(|mut s| s.execute(p)).map_err(StoreError::sql(context))?;
        if n == 0 {
            return Err(StoreError::NotFound(id.clone()));
        }
        Ok(())
    }

    /// Records a machine's instance; `started`: also counts the start that made it as a
    /// successful attempt (its last error cleared), in the same statement.
    pub(super) fn write_instance_info(
        &mut self,
        id: &MachineId,
        info: &ProvisionedInstance,
        started: bool,
    ) -> Result<(), StoreError> {
        let before = self.status_life(id)?;
        let sql = if started {
            "UPDATE machines SET instance = ?2, zone = ?3, nonce = ?4, display_name = ?5, instance_status = ?6, \
             instance_status_message = '', status = 'started', status_message = '', transient = 0, \
             start_attempts = start_attempts + 1, last_start_error = NULL, changed_at = ?7, capacity_type = ?8 \
             WHERE id = ?1"
        } else {
            "UPDATE machines SET instance = ?2, zone = ?3, nonce = ?4, display_name = ?5, instance_status = ?6, \
             instance_status_message = '', status = 'started', status_message = '', transient = 0, \
             changed_at = ?7, capacity_type = ?8 WHERE id = ?1"
        };
        let stamp = self.stamp();
        self.update_machine(
            id,
            "recording an instance",
            sql,
            &[
                &id.as_str(),
                &info.instance.as_str(),
                &info.zone,
                &info.nonce,
                &info.display_name,
                &info.status.as_str(),
                &stamp.as_ref(),
                &info.capacity_type.map(crate::model::CapacityType::as_str),
            ],
        )?;
        self.count_machine(before, Some(MachineStatus::Started.as_str()), None, Some(info.status.as_str()));
        Ok(())
    }

    /// The id of the row holding this constraint set (made if new); `None` for no constraint.
    pub(super) fn constraint_row(tx: &Connection, c: &Constraints) -> Result<Option<i64>, StoreError> {
        let Some(r) = ConstraintRow::of(c) else { return Ok(None) };
        let ctx = "storing a constraint";
        tx.execute(
            "INSERT INTO constraints (spec, zones, arch, cores, mem_mb, root_disk_mb, instance_type, spaces, tags) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9) ON CONFLICT(spec) DO NOTHING",
            params![r.spec, r.zones, r.arch, r.cores, r.mem_mb, r.root_disk_mb, r.instance_type, r.spaces, r.tags],
        )
        .map_err(StoreError::sql(ctx))?;
        tx.query_row("SELECT id FROM constraints WHERE spec = ?1", [&r.spec], |r| r.get(0))
            .map(Some)
            .map_err(StoreError::sql(ctx))
    }

    /// Inserts `count` machines like `spec` in `tx` (ids never reused), stamped `stamp`: their
    /// ids taken from the counter at once, their rows by one statement (ids `n` to
    /// `n + count - 1`, each its `seq` as text), not a statement per machine.
    pub(super) fn insert_machines(
        tx: &Connection,
        count: usize,
        spec: &NewMachine,
        stamp: &str,
    ) -> Result<Vec<MachineId>, StoreError> {
        if count == 0 {
            return Ok(Vec::new());
        }
        let constraint = Self::constraint_row(tx, &spec.constraints)?;
        let first =
            take_counter(tx, "next_machine", count as u64).map_err(StoreError::sql("allocating machine ids"))?;
        let end = first + count as u64;
        let added = tx
            .prepare_cached(
                "WITH RECURSIVE n(seq) AS (SELECT ?1 UNION ALL SELECT seq + 1 FROM n WHERE seq + 1 < ?2) \
                 INSERT INTO machines (seq, id, constraints_id, placement, application, changed_at, capacity, \
                 trace_parent) SELECT seq, CAST(seq AS TEXT), ?3, ?4, ?5, ?6, ?7, ?8 FROM n",
            )
            .and_then(|mut st| {
                let capacity = super::rows::capacity_column(spec.capacity);
                st.execute(params![
                    first as i64,
                    end as i64,
                    constraint,
                    spec.placement,
                    spec.application,
                    stamp,
                    capacity,
                    spec.trace_parent
                ])
            })
            .map_err(StoreError::sql("adding machines"))?;
        if added != count {
            return Err(StoreError::Refused(format!("{added} machines were added of the {count} asked for")));
        }
        Ok((first..end).map(|n| MachineId::from(n.to_string())).collect())
    }

    /// Counts and notifies machines just added.
    pub(super) fn added(&mut self, ids: &[MachineId]) {
        self.book.added(ids, MachineStatus::Pending);
    }
}
