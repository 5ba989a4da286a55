//! The SQLite backend's operations: [`StoreBackend`] implemented by [`StoreCore`], the store's
//! own state, the model, its machines, applications, containers and manual machines here;
//! group commits, instances, start intents and tokens in their own files.

use std::collections::{BTreeMap, BTreeSet};

use rusqlite::{params, OptionalExtension, Row};

use super::rows::{
    constraints_from_row, machine_from_row, meta_get, meta_set, next_counter, select_all, text_column, Atomic,
    CONSTRAINT_COLUMNS, MACHINE_COLUMNS, MACHINE_FROM,
};
use super::{file_identity, group, instances, intents, tokens, StoreCore};
use crate::model::{
    CloudInstance, Constraints, HarvestMode, InstanceId, InstanceState, InstanceStatus, InstanceTags, Life, Machine,
    MachineId, MachineStatus, ProvisioningInfo,
};
use crate::ports::ProvisionedInstance;
use crate::service::store::backend::{refuse_constraints_change, refuse_hosts_with_live_containers, StoreBackend};
use crate::service::store::errors::StoreError;
use crate::service::store::records::{
    ApplicationRecord, InstanceRecord, MachineRecord, NewMachine, Settings, StoreCounts, CONTAINER_SEQ_BASE,
};
use crate::service::token::{Scope, TokenRecord};

impl StoreBackend for StoreCore {
    fn kind(&self) -> &'static str {
        "sqlite"
    }

    // ---- group commit: `group.rs` ----------------------------------------------------------

    fn begin_group(&mut self, durable: bool) -> Result<bool, StoreError> {
        group::begin_group(self, durable).map(|()| true)
    }
    fn begin_member(&mut self) -> Result<(), StoreError> {
        group::begin_member(self)
    }
    fn end_member(&mut self, keep: bool) -> Result<(), StoreError> {
        group::end_member(self, keep)
    }
    fn group_has_written(&self) -> bool {
        group::group_has_written(self)
    }
    fn commit_group(&mut self) -> Result<(), StoreError> {
        group::commit_group(self)
    }
    fn abort_group(&mut self) {
        group::abort_group(self)
    }

    // ---- the simulated cloud's instances: `instances.rs` -----------------------------------

    fn create_instance(
        &mut self,
        client_token: &str,
        zone: Option<&str>,
        tags: &InstanceTags,
    ) -> Result<(InstanceRecord, bool), StoreError> {
        instances::create_instance_in(self, client_token, zone, tags, InstanceState::Pending)
    }
    /// Created and landed by one statement.
    fn create_running_instance(
        &mut self,
        client_token: &str,
        zone: Option<&str>,
        tags: &InstanceTags,
    ) -> Result<(InstanceRecord, bool), StoreError> {
        instances::create_instance_in(self, client_token, zone, tags, InstanceState::Running)
    }
    #[cfg(test)]
    fn instance(&mut self, id: &InstanceId) -> Result<Option<InstanceRecord>, StoreError> {
        instances::instance(self, id)
    }
    fn land_instance(&mut self, id: &InstanceId) -> Result<Option<InstanceRecord>, StoreError> {
        instances::land_instance(self, id)
    }
    #[cfg(test)]
    fn all_instances(&mut self) -> Result<Vec<InstanceRecord>, StoreError> {
        instances::all_instances(self)
    }
    fn live_instances(&mut self, model: &str) -> Result<Vec<CloudInstance>, StoreError> {
        instances::live_instances(self, model)
    }
    fn terminate_instances(&mut self, ids: &[InstanceId]) -> Result<(), StoreError> {
        instances::terminate_instances(self, ids)
    }
    fn release_instances(&mut self, ids: &[InstanceId]) -> Result<(), StoreError> {
        instances::release_instances(self, ids)
    }
    fn retag_instance(&mut self, id: &InstanceId, tags: &InstanceTags) -> Result<bool, StoreError> {
        instances::retag_instance(self, id, tags)
    }
    fn pending_instances(&mut self) -> Result<Vec<InstanceId>, StoreError> {
        instances::pending_instances(self)
    }

    // ---- start intents: `intents.rs`; API tokens: `tokens.rs` --------------------------------

    fn put_start_intent(&mut self, client_token: &str, machine: &MachineId, params: &str) -> Result<(), StoreError> {
        intents::put_start_intent(self, client_token, machine, params)
    }
    fn drop_start_intent(&mut self, client_token: &str) -> Result<(), StoreError> {
        intents::drop_start_intent(self, client_token)
    }
    fn start_intents(&mut self) -> Result<Vec<String>, StoreError> {
        intents::start_intents(self)
    }
    fn create_token(
        &mut self,
        scope: Scope,
        model: Option<(&str, &str)>,
        sha256: &str,
        created: &str,
    ) -> Result<TokenRecord, StoreError> {
        tokens::create_token(self, scope, model, sha256, created)
    }
    fn revoke_model_tokens(&mut self, name: &str, uuid: &str, at: &str) -> Result<Vec<TokenRecord>, StoreError> {
        tokens::revoke_model_tokens(self, name, uuid, at)
    }
    fn tokens(&mut self) -> Result<Vec<TokenRecord>, StoreError> {
        tokens::tokens(self)
    }
    fn token_by_hash(&mut self, sha256: &str) -> Result<Option<TokenRecord>, StoreError> {
        tokens::token_by_hash(self, sha256)
    }
    fn revoke_token(&mut self, id: &str, at: &str) -> Result<TokenRecord, StoreError> {
        tokens::revoke_token(self, id, at)
    }

    // ---- the store's own state, the model, its machines and applications ----------------------

    /// Counts every machine and instance (one scan: at open, and in tests).
    fn recount(&mut self) -> Result<StoreCounts, StoreError> {
        let group = |sql: &str| -> Result<BTreeMap<String, u64>, StoreError> {
            let mut st = self.conn.prepare(sql).map_err(StoreError::sql("counting"))?;
            let rows = st
                .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)? as u64)))
                .map_err(StoreError::sql("counting"))?;
            rows.collect::<Result<_, _>>().map_err(StoreError::sql("counting"))
        };
        Ok(StoreCounts {
            machines_by_status: group("SELECT status, count(*) FROM machines GROUP BY status")?,
            machines_by_life: group("SELECT life, count(*) FROM machines GROUP BY life")?,
            instances_by_state: group("SELECT state, count(*) FROM instances GROUP BY state")?,
            model_life: self.model_life()?.to_string(),
            machines_in_error: self.machines_in_error()?,
        })
    }

    /// The gauges' counts as of the last commit.
    fn counts(&self) -> &StoreCounts {
        &self.book.counts
    }

    /// The counts, if they changed since the last call.
    fn take_counts(&mut self) -> Option<StoreCounts> {
        self.book.take_counts()
    }

    /// Remembers damage an operation ran into: from then on [`StoreBackend::check_readable`] fails.
    fn shed_memory(&mut self) {
        // Prepared again on their next use; the page cache refilled from the file.
        self.conn.flush_prepared_statement_cache();
        if let Err(e) = self.conn.execute_batch("PRAGMA shrink_memory") {
            tracing::debug!(error = %e, "cannot shrink the database's memory");
        }
    }
    fn note_damage(&mut self, e: &StoreError) {
        if matches!(e, StoreError::Damaged { .. }) && self.damaged.is_none() {
            self.damaged = Some(e.clone());
        }
    }

    /// Whether the store can be read (`/healthz`): no damage seen so far, and the model's
    /// identity and both tables' newest rows read now (a few pages, no scan).
    fn check_readable(&mut self) -> Result<(), StoreError> {
        if let Some(e) = &self.damaged {
            return Err(e.clone());
        }
        let probe = (|| -> Result<(), StoreError> {
            // The page cache could hide a file that was deleted, replaced or truncated: look at
            // the file itself (its identity and its size), then read through SQLite.
            if let Some((path, identity)) = &self.file {
                let damaged = |message: String| StoreError::Damaged { context: "reading the database file", message };
                let now = file_identity(path).map_err(|e| damaged(format!("{}: {e}", path.display())))?;
                if now != *identity {
                    return Err(damaged(format!("{} was replaced since the service opened it", path.display())));
                }
                // Truncated: the pages not in the log are gone. (The header itself may be stale
                // or even overwritten while the log holds page 1: that is SQLite's to judge.)
                let len = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
                if len < 512 {
                    return Err(damaged(format!("{} was truncated to {len} bytes", path.display())));
                }
            }
            self.model_uuid()?;
            for sql in ["SELECT max(seq) FROM machines", "SELECT max(seq) FROM instances"] {
                self.conn
                    .query_row(sql, [], |r| r.get::<_, Option<i64>>(0))
                    .map_err(StoreError::sql("reading the database"))?;
            }
            Ok(())
        })();
        if let Err(e) = &probe {
            self.note_damage(e);
        }
        probe
    }

    /// Makes the next commits fsynced (`true`, `synchronous=FULL`) or not (`NORMAL`: still in
    /// order, still surviving a process crash). In WAL mode a durable commit also makes every
    /// earlier one durable.
    fn set_durable(&mut self, durable: bool) -> Result<(), StoreError> {
        if self.durable != durable {
            let mode = if durable { "FULL" } else { "NORMAL" };
            self.conn.pragma_update(None, "synchronous", mode).map_err(StoreError::sql("setting synchronous mode"))?;
            self.durable = durable;
        }
        Ok(())
    }

    /// Takes what the watchers must hear: the machines changed since the last call, and
    /// whether a retry tick is due.
    fn take_outbox(&mut self) -> (Vec<MachineId>, bool) {
        self.book.take_outbox()
    }

    /// The model's uuid (tagged on every instance).
    fn model_uuid(&mut self) -> Result<String, StoreError> {
        meta_get(&self.conn, "model_uuid")
            .map_err(StoreError::sql("reading the model uuid"))?
            .ok_or_else(|| StoreError::Refused("the database has no model uuid".into()))
    }

    /// The model's life.
    fn model_life(&mut self) -> Result<Life, StoreError> {
        let life = meta_get(&self.conn, "model_life").map_err(StoreError::sql("reading the model life"))?;
        Ok(life.and_then(|l| l.parse().ok()).unwrap_or(Life::Alive))
    }

    /// One machine.
    fn machine(&mut self, id: &MachineId) -> Result<Option<MachineRecord>, StoreError> {
        self.conn
            .prepare_cached(&format!("SELECT {MACHINE_COLUMNS} FROM {MACHINE_FROM} WHERE m.id = ?1"))
            .and_then(|mut s| s.query_row([id.as_str()], machine_from_row).optional())
            .map_err(StoreError::sql("reading a machine"))
    }

    /// A machine as the provisioner reads it: its [`Machine`] alone (no constraints, no
    /// messages), the model port's read at every change of every machine.
    fn model_machine(&mut self, id: &MachineId) -> Result<Option<Machine>, StoreError> {
        let read = |r: &Row<'_>| -> rusqlite::Result<Machine> {
            let parse_err = |i: usize, e: crate::model::ParseError| {
                rusqlite::Error::FromSqlConversionFailure(i, rusqlite::types::Type::Text, Box::new(e))
            };
            Ok(Machine {
                id: id.clone(),
                life: r.get::<_, String>(0)?.parse().map_err(|e| parse_err(0, e))?,
                status: r.get::<_, String>(1)?.parse().map_err(|e| parse_err(1, e))?,
                instance_status: InstanceStatus::other(r.get::<_, String>(2)?),
                instance: r.get::<_, Option<String>>(3)?.map(InstanceId::from),
                keep_instance: r.get(4)?,
                manual: r.get(5)?,
                controller: false,
            })
        };
        self.conn
            .prepare_cached(
                "SELECT life, status, instance_status, instance, keep_instance, manual FROM machines WHERE id = ?1",
            )
            .and_then(|mut s| s.query_row([id.as_str()], read).optional())
            .map_err(StoreError::sql("reading a machine"))
    }

    /// A machine's constraints and placement directive: what its start needs of it.
    fn machine_provisioning(&mut self, id: &MachineId) -> Result<Option<ProvisioningInfo>, StoreError> {
        let read = |r: &Row<'_>| -> rusqlite::Result<ProvisioningInfo> {
            Ok(ProvisioningInfo {
                constraints: constraints_from_row(r, 0)?,
                placement: r.get(8)?,
                capacity: super::rows::capacity_from(r.get(9)?)
                    .map_err(|e| rusqlite::Error::FromSqlConversionFailure(9, rusqlite::types::Type::Text, e.into()))?,
                trace_parent: r.get(10)?,
                host_trace_parent: r.get(11)?,
                ..ProvisioningInfo::default()
            })
        };
        // A container's start is linked to its host's trace (issue 37): its host's context is
        // read with it (a top-level machine's statement reads none: no second look-up).
        let conn = &self.conn;
        let read_as = |sql: &str, params: &[&dyn rusqlite::ToSql]| {
            conn.prepare_cached(sql).and_then(|mut s| s.query_row(params, read).optional())
        };
        match id.container_of() {
            None => read_as(
                &format!(
                    "SELECT {CONSTRAINT_COLUMNS}, m.placement, m.capacity, m.trace_parent, NULL \
                     FROM {MACHINE_FROM} WHERE m.id = ?1"
                ),
                &[&id.as_str()],
            ),
            Some((host, _)) => read_as(
                &format!(
                    "SELECT {CONSTRAINT_COLUMNS}, m.placement, m.capacity, m.trace_parent, \
                     (SELECT h.trace_parent FROM machines h WHERE h.id = ?2) FROM {MACHINE_FROM} WHERE m.id = ?1"
                ),
                &[&id.as_str(), &host.as_str()],
            ),
        }
        .map_err(StoreError::sql("reading a machine"))
    }

    /// The application whose unit a machine hosts (`Some(None)`: none; `None`: no such
    /// machine).
    fn machine_application(&mut self, id: &MachineId) -> Result<Option<Option<String>>, StoreError> {
        self.conn
            .prepare_cached("SELECT application FROM machines WHERE id = ?1")
            .and_then(|mut s| s.query_row([id.as_str()], |r| r.get(0)).optional())
            .map_err(StoreError::sql("reading a machine"))
    }

    /// Every machine, in id order.
    fn list_machines(&mut self) -> Result<Vec<MachineRecord>, StoreError> {
        let sql = format!("SELECT {MACHINE_COLUMNS} FROM {MACHINE_FROM} ORDER BY m.seq");
        select_all(&self.conn, &sql, machine_from_row, "listing machines")
    }

    /// Every machine's id.
    fn machine_ids(&mut self) -> Result<Vec<MachineId>, StoreError> {
        text_column(&self.conn, "SELECT id FROM machines ORDER BY seq", "listing machines")
    }

    /// Records a machine's instance and instance status. The service stands in for the
    /// machine agent, which would come up with its instance: the machine becomes `started`.
    fn set_instance_info(&mut self, id: &MachineId, info: &ProvisionedInstance) -> Result<(), StoreError> {
        self.write_instance_info(id, info, false)
    }

    /// [`StoreBackend::set_instance_info`] and [`StoreBackend::record_start_outcome`] for the
    /// success, as one statement: the provisioner's record of every start.
    fn record_started_instance(&mut self, id: &MachineId, info: &ProvisionedInstance) -> Result<(), StoreError> {
        self.write_instance_info(id, info, true)
    }

    /// Writes a machine status.
    fn set_status(&mut self, id: &MachineId, status: MachineStatus, message: &str) -> Result<(), StoreError> {
        // A reset to pending ends a retry request.
        let before = self.status_life(id)?;
        let stamp = self.stamp();
        self.update_machine(
            id,
            "writing a machine status",
            "UPDATE machines SET status = ?2, status_message = ?3, \
             transient = CASE WHEN ?2 = 'pending' THEN 0 ELSE transient END, changed_at = ?4 WHERE id = ?1",
            &[&id.as_str(), &status.as_str(), &message, &stamp.as_ref()],
        )?;
        self.count_machine(before, Some(status.as_str()), None, None);
        Ok(())
    }

    /// Writes an instance status.
    fn set_instance_status(
        &mut self,
        id: &MachineId,
        status: &InstanceStatus,
        message: &str,
    ) -> Result<(), StoreError> {
        let before = self.status_life(id)?;
        let stamp = self.stamp();
        self.update_machine(
            id,
            "writing an instance status",
            "UPDATE machines SET instance_status = ?2, instance_status_message = ?3, changed_at = ?4 WHERE id = ?1",
            &[&id.as_str(), &status.as_str(), &message, &stamp.as_ref()],
        )?;
        if let Some((was, _, instance_status)) = before {
            self.book.count_error_of((&was, &instance_status), None, Some(status.as_str()));
        }
        Ok(())
    }

    /// Counts one start attempt of a machine and keeps its outcome: `error` is the failed
    /// attempt's message, `None` a success (which clears the last error).
    fn record_start_outcome(&mut self, id: &MachineId, error: Option<&str>) -> Result<(), StoreError> {
        let stamp = self.stamp();
        self.update_machine(
            id,
            "recording a start attempt",
            "UPDATE machines SET start_attempts = start_attempts + 1, last_start_error = ?2, changed_at = ?3 \
             WHERE id = ?1",
            &[&id.as_str(), &error, &stamp.as_ref()],
        )
    }

    /// Takes a machine to dead (notifies if it was not).
    fn ensure_dead(&mut self, id: &MachineId) -> Result<(), StoreError> {
        let before = self.machine(id)?.ok_or_else(|| StoreError::NotFound(id.clone()))?;
        if before.machine.life != Life::Dead {
            self.update_machine(
                id,
                "taking a machine to dead",
                "UPDATE machines SET life = 'dead' WHERE id = ?1",
                &[&id.as_str()],
            )?;
            let was = (before.machine.status.as_str().to_owned(), before.machine.life.as_str().to_owned());
            self.book.count_machine(Some(was), None, Some(Life::Dead.as_str()));
            self.book.changed.insert(id.clone());
        }
        Ok(())
    }

    /// Removes a dead machine for good (its instance is gone or released).
    fn mark_for_removal(&mut self, id: &MachineId) -> Result<(), StoreError> {
        let m = self.machine(id)?.ok_or_else(|| StoreError::NotFound(id.clone()))?;
        if m.machine.life != Life::Dead {
            return Err(StoreError::Refused(format!("machine {id} is not dead")));
        }
        self.update_machine(id, "removing a machine", "DELETE FROM machines WHERE id = ?1", &[&id.as_str()])?;
        self.book.removed(m.machine.status.as_str(), m.machine.life.as_str(), m.machine.instance_status.as_str());
        Ok(())
    }

    /// Makes the model dying and returns every machine at that moment, in one transaction.
    fn destroy_model(&mut self) -> Result<Vec<Machine>, StoreError> {
        if self.model_life()? != Life::Alive {
            return Err(StoreError::ModelDying);
        }
        let tx = Atomic::begin(&self.conn).map_err(StoreError::sql("destroying the model"))?;
        meta_set(&tx, "model_life", Life::Dying.as_str()).map_err(StoreError::sql("destroying the model"))?;
        tx.commit().map_err(StoreError::sql("destroying the model"))?;
        self.book.counts.model_life = Life::Dying.to_string();
        self.book.counts_changed = true;
        Ok(self.list_machines()?.into_iter().map(|m| m.machine).collect())
    }

    /// Asks for these machines to be removed, all or none: each becomes dead (the service
    /// stands in for the machine agents, which would take a dying machine to dead), with
    /// `keep_instance` if asked. Without `force`, a machine already dead is refused.
    fn remove_machines(&mut self, ids: &[MachineId], keep_instance: bool, force: bool) -> Result<(), StoreError> {
        if !force {
            super::backend::refuse_hosts_with_live_containers(self, ids)?;
        }
        let tx = Atomic::begin(&self.conn).map_err(StoreError::sql("removing machines"))?;
        let mut seen = BTreeSet::new();
        let mut moved = Vec::new();
        for id in ids {
            if !seen.insert(id) {
                continue; // `remove 3 3` is `remove 3`
            }
            let row: Option<(String, String)> = tx
                .query_row("SELECT life, status FROM machines WHERE id = ?1", [id.as_str()], |r| {
                    Ok((r.get(0)?, r.get(1)?))
                })
                .optional()
                .map_err(StoreError::sql("removing machines"))?;
            let life = row.as_ref().map(|(l, _)| l.clone());
            if let Some((l, s)) = row {
                moved.push((s, l));
            }
            match life.as_deref() {
                None => return Err(StoreError::NotFound(id.clone())),
                Some("dead") if !force => {
                    return Err(StoreError::Refused(format!(
                        "machine {id} is already being removed (use --force to ask again)"
                    )))
                }
                _ => {}
            }
            tx.execute(
                "UPDATE machines SET life = 'dead', keep_instance = (keep_instance OR ?2) WHERE id = ?1",
                params![id.as_str(), keep_instance],
            )
            .map_err(StoreError::sql("removing machines"))?;
        }
        tx.commit().map_err(StoreError::sql("removing machines"))?;
        for before in moved {
            self.book.count_machine(Some(before), None, Some(Life::Dead.as_str()));
        }
        self.book.changed.extend(ids.iter().cloned());
        Ok(())
    }

    /// Marks machines in provisioning error for another start (`retry-provisioning`), all or
    /// none; a retry tick is then due.
    fn retry_machines(&mut self, ids: &[MachineId]) -> Result<(), StoreError> {
        let tx = Atomic::begin(&self.conn).map_err(StoreError::sql("marking machines for retry"))?;
        for id in ids.iter().collect::<BTreeSet<_>>() {
            let row: Option<(String, Option<String>, String)> = tx
                .query_row("SELECT life, instance, instance_status FROM machines WHERE id = ?1", [id.as_str()], |r| {
                    Ok((r.get(0)?, r.get(1)?, r.get(2)?))
                })
                .optional()
                .map_err(StoreError::sql("marking machines for retry"))?;
            let Some((life, instance, status)) = row else { return Err(StoreError::NotFound(id.clone())) };
            if life != "alive" || instance.is_some() || !InstanceStatus::other(status).is_error() {
                return Err(StoreError::Refused(format!("machine {id} is not in a provisioning error")));
            }
            tx.execute("UPDATE machines SET transient = 1 WHERE id = ?1", [id.as_str()])
                .map_err(StoreError::sql("marking machines for retry"))?;
        }
        tx.commit().map_err(StoreError::sql("marking machines for retry"))?;
        self.book.retry_due = true;
        Ok(())
    }

    /// Replaces a live, non-manual machine's constraints: its `constraints_id` points at the
    /// row of the new set (made if new, as at insert), or at none for an empty set.
    fn set_constraints(&mut self, id: &MachineId, constraints: &Constraints) -> Result<(), StoreError> {
        let ctx = "changing a machine's constraints";
        let tx = Atomic::begin(&self.conn).map_err(StoreError::sql(ctx))?;
        let row: Option<(String, bool)> = tx
            .query_row("SELECT life, manual FROM machines WHERE id = ?1", [id.as_str()], |r| Ok((r.get(0)?, r.get(1)?)))
            .optional()
            .map_err(StoreError::sql(ctx))?;
        let Some((life, manual)) = row else { return Err(StoreError::NotFound(id.clone())) };
        refuse_constraints_change(id, &life, manual)?;
        let constraint = Self::constraint_row(&tx, constraints)?;
        tx.execute("UPDATE machines SET constraints_id = ?2 WHERE id = ?1", params![id.as_str(), constraint])
            .map_err(StoreError::sql(ctx))?;
        tx.commit().map_err(StoreError::sql(ctx))?;
        self.book.changed.insert(id.clone());
        Ok(())
    }

    /// The settings changed at run time.
    fn settings(&mut self) -> Result<Settings, StoreError> {
        let mode = meta_get(&self.conn, "harvest_mode").map_err(StoreError::sql("reading settings"))?;
        let workers = meta_get(&self.conn, "workers").map_err(StoreError::sql("reading settings"))?;
        let mut repair: [Option<String>; 4] = Default::default();
        for (slot, key) in repair.iter_mut().zip(Settings::REPAIR_KEYS) {
            *slot = meta_get(&self.conn, key).map_err(StoreError::sql("reading settings"))?;
        }
        Ok(Settings::from_meta(mode, workers, repair))
    }

    /// Persists the repair policy (every key in the write's transaction).
    fn set_repair(&mut self, policy: crate::config::repair::RepairPolicy) -> Result<(), StoreError> {
        for (key, value) in Settings::REPAIR_KEYS.iter().zip(Settings::repair_meta(&policy)) {
            meta_set(&self.conn, key, &value).map_err(StoreError::sql("writing the repair policy"))?;
        }
        Ok(())
    }

    /// Persists the harvest mode.
    fn set_harvest_mode(&mut self, mode: HarvestMode) -> Result<(), StoreError> {
        meta_set(&self.conn, "harvest_mode", mode.as_str()).map_err(StoreError::sql("writing the harvest mode"))
    }

    /// Persists the worker pool size.
    fn set_workers(&mut self, workers: usize) -> Result<(), StoreError> {
        meta_set(&self.conn, "workers", &workers.to_string()).map_err(StoreError::sql("writing the worker count"))
    }

    /// Adds `count` new alive, pending machines like `spec` (constraints, placement,
    /// application), in one transaction. Refused while the model is dying. The caller has
    /// validated `spec`.
    fn add_new_machines(&mut self, count: usize, spec: &NewMachine) -> Result<Vec<MachineId>, StoreError> {
        if self.model_life()? != Life::Alive {
            return Err(StoreError::ModelDying);
        }
        let stamp = self.stamp();
        let tx = Atomic::begin(&self.conn).map_err(StoreError::sql("adding machines"))?;
        let ids = Self::insert_machines(&tx, count, spec, &stamp)?;
        tx.commit().map_err(StoreError::sql("adding machines"))?;
        self.added(&ids);
        Ok(ids)
    }

    /// Adds an application and `units` machines for its units, each with its constraints, in
    /// one transaction. Refused while the model is dying, or if the application exists.
    fn add_application(
        &mut self,
        name: &str,
        units: usize,
        constraints: &Constraints,
        capacity: crate::model::CapacityPreference,
    ) -> Result<Vec<MachineId>, StoreError> {
        if self.model_life()? != Life::Alive {
            return Err(StoreError::ModelDying);
        }
        let ctx = "adding an application";
        let tx = Atomic::begin(&self.conn).map_err(StoreError::sql(ctx))?;
        let exists: bool = tx
            .query_row("SELECT count(*) FROM applications WHERE name = ?1", [name], |r| r.get::<_, i64>(0))
            .map_err(StoreError::sql(ctx))?
            > 0;
        if exists {
            return Err(StoreError::Refused(format!("application {name:?} already exists")));
        }
        let constraint = Self::constraint_row(&tx, constraints)?;
        tx.execute(
            "INSERT INTO applications (name, constraints_id, capacity) VALUES (?1, ?2, ?3)",
            params![name, constraint, super::rows::capacity_column(capacity)],
        )
        .map_err(StoreError::sql(ctx))?;
        let spec = NewMachine {
            constraints: constraints.clone(),
            application: Some(name.to_owned()),
            capacity,
            ..NewMachine::default()
        };
        let ids = Self::insert_machines(&tx, units, &spec, &self.stamp())?;
        tx.commit().map_err(StoreError::sql(ctx))?;
        self.added(&ids);
        Ok(ids)
    }

    /// Every application, by name, with its constraints and its machines that are not dead.
    fn applications(&mut self) -> Result<Vec<ApplicationRecord>, StoreError> {
        let sql = "SELECT a.name, c.spec, a.capacity FROM applications a \
                   LEFT JOIN constraints c ON c.id = a.constraints_id ORDER BY a.name";
        let rows: Vec<(String, Option<String>, Option<String>)> =
            select_all(&self.conn, sql, |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)), "listing applications")?;
        rows.into_iter()
            .map(|(name, spec, capacity)| {
                // Written from a parsed set: it parses back (an unreadable row shows unconstrained).
                let constraints = spec.and_then(|s| Constraints::parse(&s).ok()).unwrap_or_default();
                let capacity = super::rows::capacity_from(capacity).unwrap_or_default();
                let machines = self.application_machines(&name)?;
                Ok(ApplicationRecord { name, constraints, capacity, machines })
            })
            .collect()
    }

    /// The machines of an application that are not dead, in id order.
    fn application_machines(&mut self, name: &str) -> Result<Vec<MachineId>, StoreError> {
        let mut st = self
            .conn
            .prepare_cached("SELECT id FROM machines WHERE application = ?1 AND life != 'dead' ORDER BY seq")
            .map_err(StoreError::sql("reading an application's machines"))?;
        let ids = st
            .query_map([name], |r| r.get::<_, String>(0).map(MachineId::from))
            .and_then(|rows| rows.collect())
            .map_err(StoreError::sql("reading an application's machines"));
        ids
    }

    /// Removes an application: its machines become dead (the provisioner stops their
    /// instances, then removes them) and it is forgotten, in one transaction. Returns the
    /// machines it took to dead.
    fn remove_application(&mut self, name: &str) -> Result<Vec<MachineId>, StoreError> {
        let ctx = "removing an application";
        let tx = Atomic::begin(&self.conn).map_err(StoreError::sql(ctx))?;
        let n = tx.execute("DELETE FROM applications WHERE name = ?1", [name]).map_err(StoreError::sql(ctx))?;
        if n == 0 {
            return Err(StoreError::NoApplication(name.to_owned()));
        }
        let mut moved = Vec::new();
        {
            let mut st = tx
                .prepare("SELECT id, status, life FROM machines WHERE application = ?1 AND life != 'dead' ORDER BY seq")
                .map_err(StoreError::sql(ctx))?;
            let rows = st
                .query_map([name], |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?, r.get::<_, String>(2)?)))
                .map_err(StoreError::sql(ctx))?;
            for row in rows {
                moved.push(row.map_err(StoreError::sql(ctx))?);
            }
        }
        tx.execute("UPDATE machines SET life = 'dead' WHERE application = ?1 AND life != 'dead'", [name])
            .map_err(StoreError::sql(ctx))?;
        tx.commit().map_err(StoreError::sql(ctx))?;
        let mut ids = Vec::with_capacity(moved.len());
        for (id, status, life) in moved {
            self.book.count_machine(Some((status, life)), None, Some(Life::Dead.as_str()));
            ids.push(MachineId::from(id));
        }
        self.book.changed.extend(ids.iter().cloned());
        Ok(ids)
    }

    /// Adds `count` alive, pending containers of `kind` on `host`: `HOST/KIND/N`, numbered per
    /// host and type from 0 (never reused). The host must exist and be alive (else
    /// [`StoreError::Invalid`] naming `host`, nothing written); refused while the model is
    /// dying.
    fn add_containers(&mut self, host: &MachineId, kind: &str, count: usize) -> Result<Vec<MachineId>, StoreError> {
        if self.model_life()? != Life::Alive {
            return Err(StoreError::ModelDying);
        }
        match self.machine(host)? {
            None => {
                return Err(StoreError::Invalid { field: "host", message: format!("machine {host} does not exist") })
            }
            Some(h) if h.machine.life != Life::Alive => {
                return Err(StoreError::Invalid {
                    field: "host",
                    message: format!("machine {host} is {}: containers need an alive host", h.machine.life),
                })
            }
            Some(_) => {}
        }
        let tx = Atomic::begin(&self.conn).map_err(StoreError::sql("adding containers"))?;
        let mut ids = Vec::with_capacity(count);
        {
            let mut insert = tx
                .prepare_cached("INSERT INTO machines (seq, id) VALUES (?1, ?2)")
                .map_err(StoreError::sql("adding containers"))?;
            let key = format!("next_container/{host}/{kind}");
            for _ in 0..count {
                let n = next_counter(&tx, &key).map_err(StoreError::sql("allocating a container id"))?;
                let seq =
                    next_counter(&tx, "next_container_seq").map_err(StoreError::sql("allocating a container id"))?;
                let id = format!("{host}/{kind}/{n}");
                insert
                    .execute(params![CONTAINER_SEQ_BASE + seq as i64, id])
                    .map_err(StoreError::sql("adding containers"))?;
                ids.push(MachineId::from(id));
            }
        }
        tx.commit().map_err(StoreError::sql("adding containers"))?;
        self.book.added(&ids, MachineStatus::Pending);
        Ok(ids)
    }

    /// Registers a manually provisioned machine at `address` (validated by the caller): a new
    /// top-level id, shown as Juju's manual provider shows one (status `started`, instance
    /// `manual:ADDRESS`, instance status `running`); the provisioner never starts or stops it.
    /// An address already a live manual machine's is [`StoreError::Invalid`] naming `address`.
    fn add_manual(&mut self, address: &str) -> Result<MachineId, StoreError> {
        if self.model_life()? != Life::Alive {
            return Err(StoreError::ModelDying);
        }
        let taken: Option<String> = self
            .conn
            .query_row(
                "SELECT id FROM machines WHERE manual = 1 AND address = ?1 AND life != 'dead' ORDER BY seq LIMIT 1",
                [address],
                |r| r.get(0),
            )
            .optional()
            .map_err(StoreError::sql("adding a manual machine"))?;
        if let Some(id) = taken {
            return Err(StoreError::Invalid {
                field: "address",
                message: format!("{address} is already manual machine {id}"),
            });
        }
        let tx = Atomic::begin(&self.conn).map_err(StoreError::sql("adding a manual machine"))?;
        let n = next_counter(&tx, "next_machine").map_err(StoreError::sql("allocating a machine id"))?;
        let id = MachineId::from(n.to_string());
        tx.execute(
            "INSERT INTO machines (seq, id, status, status_message, instance, instance_status, manual, address) \
             VALUES (?1, ?2, 'started', ?3, ?4, ?5, 1, ?6)",
            params![
                n as i64,
                id.as_str(),
                format!("manually provisioned at {address}"),
                format!("manual:{address}"),
                InstanceStatus::running().as_str(),
                address
            ],
        )
        .map_err(StoreError::sql("adding a manual machine"))?;
        tx.commit().map_err(StoreError::sql("adding a manual machine"))?;
        self.book.added(std::slice::from_ref(&id), MachineStatus::Started);
        Ok(id)
    }

    /// The containers on `host` that are not dead, in id order.
    fn live_containers_of(&mut self, host: &MachineId) -> Result<Vec<MachineId>, StoreError> {
        let mut stmt = self
            .conn
            .prepare_cached("SELECT id FROM machines WHERE substr(id, 1, length(?1) + 1) = ?1 || '/' AND life != 'dead' ORDER BY seq")
            .map_err(StoreError::sql("listing containers"))?;
        let rows = stmt
            .query_map([host.as_str()], |r| r.get::<_, String>(0).map(MachineId::from))
            .map_err(StoreError::sql("listing containers"))?;
        let ids: Vec<MachineId> = rows.collect::<Result<_, _>>().map_err(StoreError::sql("listing containers"))?;
        Ok(ids.into_iter().filter(|c| c.container_of().is_some_and(|(h, _)| &h == host)).collect())
    }

    /// How many machines are in error (through the partial index `machines_in_error`).
    fn machines_in_error(&mut self) -> Result<u64, StoreError> {
        self.conn
            .prepare_cached("SELECT count(*) FROM machines INDEXED BY machines_in_error WHERE status = 'error' OR instance_status = 'provisioning error'")
            .and_then(|mut st| st.query_row([], |r| r.get::<_, i64>(0)))
            .map(|n| n as u64)
            .map_err(StoreError::sql("counting machines in error"))
    }

    /// The live manual machines (they refuse a model destruction without `force`), in id order.
    fn live_manual_machines(&mut self) -> Result<Vec<MachineId>, StoreError> {
        let sql = "SELECT id FROM machines WHERE manual = 1 AND life != 'dead' ORDER BY seq";
        text_column(&self.conn, sql, "listing manual machines")
    }
}
