//! The PostgreSQL backend's operations: [`StoreBackend`] implemented by [`PgStore`] (its group
//! commit's steps in `group.rs`, its write-behind units in `deferred.rs`).

use super::client::{CallError, Reply};
use super::conn::{pg, Run};
use super::group;
use super::pool::Conn;
use super::rows::{
    add_many_params, constraints_from_row, instance_from_row, lean_machine_from_row, life_in, machine_from_row,
    meta_get, meta_set, next_counter, notify, token_from_row, ADD_MANY_SQL, INSTANCE_COLUMNS, LEAN_MACHINE_SQL,
    MACHINE_APPLICATION_SQL, MACHINE_COLUMNS, MACHINE_FROM, MACHINE_PROVISIONING_SQL, TOKEN_COLUMNS,
};
use super::{PgStore, MAX_GROUP, MAX_GROUP_TIME};
use crate::model::{
    CloudInstance, Constraints, HarvestMode, InstanceId, InstanceState, InstanceStatus, InstanceTags, Life, Machine,
    MachineId, MachineStatus, ProvisioningInfo,
};
use crate::ports::ProvisionedInstance;
use crate::service::store::backend::{
    refuse_constraints_change, refuse_hosts_with_live_containers, Fence, StoreBackend,
};
use crate::service::store::errors::StoreError;
use crate::service::store::records::{
    ApplicationRecord, InstanceRecord, MachineRecord, NewMachine, Settings, StoreCounts, CONTAINER_SEQ_BASE,
};
use crate::service::store::writes::{Write, Written};
use crate::service::token::{token_id, Scope, TokenRecord};
use postgres::types::ToSql;
use tokio::time::Instant;

/// How recently the store's connection must have answered for [`StoreBackend::check_alive`] to
/// take that as its answer.
const ALIVE_WITHIN: std::time::Duration = std::time::Duration::from_secs(1);

impl StoreBackend for PgStore {
    fn kind(&self) -> &'static str {
        "postgres"
    }

    fn set_durable(&mut self, durable: bool) -> Result<(), StoreError> {
        self.durable = durable; // applied to the session before the next statement
        Ok(())
    }
    fn set_fenced(&mut self, fenced: bool) {
        self.fenced = fenced;
    }
    fn set_fence(&mut self, fence: Option<Fence>) -> Result<(), StoreError> {
        if self.group.is_some() {
            return Err(StoreError::Refused("the fence cannot change inside a group commit".into()));
        }
        self.fence = fence;
        Ok(())
    }
    fn begin_group(&mut self, durable: bool) -> Result<bool, StoreError> {
        group::begin_group(self, durable)
    }
    fn group_full(&self, units: usize) -> bool {
        units >= MAX_GROUP || self.group.as_ref().and_then(|g| g.began).is_some_and(|t| t.elapsed() >= MAX_GROUP_TIME)
    }
    fn raise_group_durability(&mut self) -> bool {
        // `synchronous_commit` is read at the commit: the group's is set just before it.
        match self.group.as_mut() {
            Some(g) => {
                g.durable = true;
                true
            }
            None => false,
        }
    }
    fn begin_member(&mut self) -> Result<(), StoreError> {
        group::begin_member(self)
    }
    fn end_member(&mut self, keep: bool) -> Result<(), StoreError> {
        group::end_member(self, keep)
    }
    fn group_has_written(&self) -> bool {
        self.group.as_ref().is_some_and(|g| g.written)
    }
    fn defer(&mut self, write: Write) -> Option<Write> {
        let Some(group) = self.group.as_mut().filter(|g| g.member.is_none()) else {
            return Some(write);
        };
        if let Write::AddMachines { count, spec } = &write {
            // Constraints are stored first, by statements of their own: such an add runs alone.
            if *count == 0 || !spec.constraints.is_empty() {
                return Some(write);
            }
        }
        // The group's time bound runs from its first unit of work, queued or sent.
        group.began.get_or_insert_with(Instant::now);
        group.deferred.push(write);
        None
    }
    fn take_deferred(&mut self) -> Vec<Result<Written, StoreError>> {
        std::mem::take(&mut self.deferred_results)
    }
    fn commit_group(&mut self) -> Result<(), StoreError> {
        group::commit_group(self)
    }
    fn abort_group(&mut self) {
        group::abort_group(self)
    }

    fn api_token_hash(&mut self, offer: &str) -> Result<String, StoreError> {
        let ctx = "keeping the API token's hash";
        let mut tx = self.begin_with(ctx, None)?;
        tx.execute(
            "INSERT INTO meta (key, value) VALUES ('api_token_sha256', $1) ON CONFLICT (key) DO NOTHING",
            &[&offer],
        )
        .map_err(pg(ctx))?;
        let kept = meta_get(&mut tx, "api_token_sha256").map_err(pg(ctx))?.unwrap_or_else(|| offer.to_owned());
        tx.commit().map_err(pg(ctx))?;
        Ok(kept)
    }
    fn take_outbox(&mut self) -> (Vec<MachineId>, bool) {
        self.book.take_outbox()
    }
    fn counts(&self) -> &StoreCounts {
        &self.book.counts
    }
    fn take_counts(&mut self) -> Option<StoreCounts> {
        self.book.take_counts()
    }
    fn recount(&mut self) -> Result<StoreCounts, StoreError> {
        let client = self.client.as_mut().ok_or_else(|| StoreError::Unavailable("no connection".into()))?;
        let mut group = |sql: &str| -> Result<std::collections::BTreeMap<String, u64>, StoreError> {
            let rows = client.query(sql, &[]).map_err(pg("counting"))?;
            Ok(rows.iter().map(|r| (r.get::<_, String>(0), r.get::<_, i64>(1) as u64)).collect())
        };
        let machines_by_status = group("SELECT status, count(*) FROM machines GROUP BY status")?;
        let machines_by_life = group("SELECT life, count(*) FROM machines GROUP BY life")?;
        let instances_by_state = group("SELECT state, count(*) FROM instances GROUP BY state")?;
        let life = meta_get(client, "model_life").map_err(pg("reading the model life"))?;
        let model_life = life.and_then(|l| l.parse::<Life>().ok()).unwrap_or(Life::Alive).to_string();
        let machines_in_error = count_in_error(client)?;
        Ok(StoreCounts { machines_by_status, machines_by_life, instances_by_state, model_life, machines_in_error })
    }
    fn refresh_counts(&mut self, resync: bool, senders: &[i32]) -> Result<(), StoreError> {
        let own = self.last_pid;
        if resync || senders.iter().any(|p| Some(*p) != own) {
            self.client()?; // the open group's savepoints sent first
            self.book.counts = self.recount()?;
            self.book.counts_changed = true;
        }
        Ok(())
    }
    fn session_pid(&self) -> Option<i32> {
        self.last_pid
    }
    fn release_connection(&mut self) {
        self.release();
    }
    fn note_damage(&mut self, e: &StoreError) {
        // A lost connection is not damage: drop it, the next operation reconnects.
        if let StoreError::Postgres { source, .. } = e {
            if source.connection_lost {
                self.client = None;
            }
        }
    }
    fn check_readable(&mut self) -> Result<(), StoreError> {
        let r = self
            .client()?
            .query_opt("SELECT value FROM meta WHERE key = 'model_uuid'", &[])
            .map_err(pg("reading the database"));
        if let Err(e) = &r {
            self.note_damage(e);
        }
        r?.map(|_| ()).ok_or_else(|| StoreError::Refused("the database has no model uuid".into()))
    }

    fn check_alive(&mut self) -> Result<(), StoreError> {
        // Its connection, as it is: no model's statement runs here, so the session's
        // `search_path` (a round trip to set) does not matter.
        let conn = self.held_connection()?;
        if conn.client.answered_within(ALIVE_WITHIN) {
            return Ok(());
        }
        conn.query_one("SELECT 1", &[]).map(drop).map_err(pg("asking the database"))
    }

    fn model_uuid(&mut self) -> Result<String, StoreError> {
        self.client()?;
        self.model_uuid.clone().ok_or_else(|| StoreError::Refused("the database has no model uuid".into()))
    }
    fn model_life(&mut self) -> Result<Life, StoreError> {
        let life = meta_get(self.client()?, "model_life").map_err(pg("reading the model life"))?;
        Ok(life.and_then(|l| l.parse().ok()).unwrap_or(Life::Alive))
    }
    fn machine(&mut self, id: &MachineId) -> Result<Option<MachineRecord>, StoreError> {
        let row = self
            .client()?
            .query_opt(&format!("SELECT {MACHINE_COLUMNS} FROM {MACHINE_FROM} WHERE m.id = $1"), &[&id.as_str()])
            .map_err(pg("reading a machine"))?;
        row.as_ref().map(machine_from_row).transpose()
    }
    #[cfg(test)]
    fn machines(&mut self, ids: &[MachineId]) -> Result<Vec<Option<MachineRecord>>, StoreError> {
        // One statement for them all (the provisioner reads its machines in batches).
        let sql = format!("SELECT {MACHINE_COLUMNS} FROM {MACHINE_FROM} WHERE m.id = ANY($1)");
        self.read_many(ids, &sql, machine_from_row)
    }
    fn model_machines(&mut self, ids: &[MachineId]) -> Result<Vec<Option<Machine>>, StoreError> {
        self.read_many(ids, LEAN_MACHINE_SQL, lean_machine_from_row)
    }
    fn machine_applications(&mut self, ids: &[MachineId]) -> Result<Vec<Option<Option<String>>>, StoreError> {
        self.read_many(ids, MACHINE_APPLICATION_SQL, |r| r.try_get(1).map_err(pg("reading a machine")))
    }
    fn provisioning_info(&mut self, ids: &[MachineId]) -> Result<Vec<Option<ProvisioningInfo>>, StoreError> {
        self.read_many(ids, MACHINE_PROVISIONING_SQL, |r| {
            Ok(ProvisioningInfo {
                constraints: constraints_from_row(r, 1)?,
                placement: r.try_get(9).map_err(pg("reading a machine"))?,
                capacity: super::rows::capacity_from(r, 10)?,
                trace_parent: r.try_get(11).map_err(pg("reading a machine"))?,
                host_trace_parent: r.try_get(12).map_err(pg("reading a machine"))?,
                ..ProvisioningInfo::default()
            })
        })
    }
    fn list_machines(&mut self) -> Result<Vec<MachineRecord>, StoreError> {
        let rows = self
            .client()?
            .query(&format!("SELECT {MACHINE_COLUMNS} FROM {MACHINE_FROM} ORDER BY m.seq"), &[])
            .map_err(pg("listing machines"))?;
        rows.iter().map(machine_from_row).collect()
    }
    fn machine_ids(&mut self) -> Result<Vec<MachineId>, StoreError> {
        self.query_ids("listing machines", "SELECT id FROM machines ORDER BY seq", &[])
    }
    fn set_instance_info(&mut self, id: &MachineId, info: &ProvisionedInstance) -> Result<(), StoreError> {
        self.record_instance(id, info, false)
    }
    fn set_status(&mut self, id: &MachineId, status: MachineStatus, message: &str) -> Result<(), StoreError> {
        let before = self.update_machine(
            id,
            "writing a machine status",
            "UPDATE machines SET status = $2, status_message = $3, \
             transient = CASE WHEN $2 = 'pending' THEN false ELSE transient END WHERE id = $1",
            &[&id.as_str(), &status.as_str(), &message],
        )?;
        if let Some((was, life, instance_status)) = before {
            self.book.count_error_of((&was, &instance_status), Some(status.as_str()), None);
            self.book.count_machine(Some((was, life)), Some(status.as_str()), None);
        }
        Ok(())
    }
    fn set_instance_status(
        &mut self,
        id: &MachineId,
        status: &InstanceStatus,
        message: &str,
    ) -> Result<(), StoreError> {
        let before = self.update_machine(
            id,
            "writing an instance status",
            "UPDATE machines SET instance_status = $2, instance_status_message = $3 WHERE id = $1",
            &[&id.as_str(), &status.as_str(), &message],
        )?;
        if let Some((was, _, instance_status)) = before {
            self.book.count_error_of((&was, &instance_status), None, Some(status.as_str()));
        }
        Ok(())
    }
    fn record_started_instance(&mut self, id: &MachineId, info: &ProvisionedInstance) -> Result<(), StoreError> {
        self.record_instance(id, info, true)
    }
    fn record_start_outcome(&mut self, id: &MachineId, error: Option<&str>) -> Result<(), StoreError> {
        self.update_machine(
            id,
            "recording a start attempt",
            "UPDATE machines SET start_attempts = start_attempts + 1, last_start_error = $2 WHERE id = $1",
            &[&id.as_str(), &error],
        )
        .map(|_| ())
    }
    fn ensure_dead(&mut self, id: &MachineId) -> Result<(), StoreError> {
        let ctx = "taking a machine to dead";
        let uuid = self.uuid();
        let mut tx = self.begin(ctx)?;
        let (status, life, _) = Self::status_life_in(&mut tx, id)?.ok_or_else(|| StoreError::NotFound(id.clone()))?;
        let before = (status, life);
        if before.1 == Life::Dead.as_str() {
            return Ok(()); // nothing to write (the transaction rolls back)
        }
        tx.execute("UPDATE machines SET life = 'dead' WHERE id = $1", &[&id.as_str()]).map_err(pg(ctx))?;
        notify(&mut tx, &uuid, "machines", std::slice::from_ref(id))?;
        tx.commit().map_err(pg(ctx))?;
        self.book.count_machine(Some(before), None, Some(Life::Dead.as_str()));
        self.book.changed.insert(id.clone());
        Ok(())
    }
    fn mark_for_removal(&mut self, id: &MachineId) -> Result<(), StoreError> {
        let ctx = "removing a machine";
        let uuid = self.uuid();
        let mut tx = self.begin(ctx)?;
        let (status, life, instance_status) =
            Self::status_life_in(&mut tx, id)?.ok_or_else(|| StoreError::NotFound(id.clone()))?;
        if life != Life::Dead.as_str() {
            return Err(StoreError::Refused(format!("machine {id} is not dead")));
        }
        tx.execute("DELETE FROM machines WHERE id = $1", &[&id.as_str()]).map_err(pg(ctx))?;
        notify(&mut tx, &uuid, "machines", std::slice::from_ref(id))?;
        tx.commit().map_err(pg(ctx))?;
        self.book.removed(&status, &life, &instance_status);
        Ok(())
    }
    fn destroy_model(&mut self) -> Result<Vec<Machine>, StoreError> {
        let ctx = "destroying the model";
        let uuid = self.uuid();
        let mut tx = self.begin(ctx)?;
        if life_in(&mut tx)? != Life::Alive {
            return Err(StoreError::ModelDying);
        }
        meta_set(&mut tx, "model_life", Life::Dying.as_str()).map_err(pg(ctx))?;
        let rows =
            tx.query(&format!("SELECT {MACHINE_COLUMNS} FROM {MACHINE_FROM} ORDER BY m.seq"), &[]).map_err(pg(ctx))?;
        let machines = rows.iter().map(|r| machine_from_row(r).map(|m| m.machine)).collect::<Result<Vec<_>, _>>()?;
        notify(&mut tx, &uuid, "model", &[])?;
        tx.commit().map_err(pg(ctx))?;
        self.book.counts.model_life = Life::Dying.to_string();
        self.book.counts_changed = true;
        Ok(machines)
    }
    fn remove_machines(&mut self, ids: &[MachineId], keep_instance: bool, force: bool) -> Result<(), StoreError> {
        if !force {
            refuse_hosts_with_live_containers(self, ids)?;
        }
        let ctx = "removing machines";
        let uuid = self.uuid();
        let mut tx = self.begin(ctx)?;
        let mut seen = std::collections::BTreeSet::new();
        let mut moved = Vec::new();
        for id in ids {
            if !seen.insert(id) {
                continue;
            }
            let Some((status, life, _)) = Self::status_life_in(&mut tx, id)? else {
                return Err(StoreError::NotFound(id.clone()));
            };
            if life == "dead" && !force {
                return Err(StoreError::Refused(format!(
                    "machine {id} is already being removed (use --force to ask again)"
                )));
            }
            tx.execute(
                "UPDATE machines SET life = 'dead', keep_instance = (keep_instance OR $2) WHERE id = $1",
                &[&id.as_str(), &keep_instance],
            )
            .map_err(pg(ctx))?;
            moved.push((status, life));
        }
        notify(&mut tx, &uuid, "machines", ids)?;
        tx.commit().map_err(pg(ctx))?;
        for before in moved {
            self.book.count_machine(Some(before), None, Some(Life::Dead.as_str()));
        }
        self.book.changed.extend(ids.iter().cloned());
        Ok(())
    }
    fn retry_machines(&mut self, ids: &[MachineId]) -> Result<(), StoreError> {
        let ctx = "marking machines for retry";
        let uuid = self.uuid();
        let mut tx = self.begin(ctx)?;
        for id in ids.iter().collect::<std::collections::BTreeSet<_>>() {
            let row = tx
                .query_opt(
                    "SELECT life, instance, instance_status FROM machines WHERE id = $1 FOR UPDATE",
                    &[&id.as_str()],
                )
                .map_err(pg(ctx))?;
            let Some(row) = row else { return Err(StoreError::NotFound(id.clone())) };
            let (life, instance, status): (String, Option<String>, String) = (row.get(0), row.get(1), row.get(2));
            if life != "alive" || instance.is_some() || !InstanceStatus::other(status).is_error() {
                return Err(StoreError::Refused(format!("machine {id} is not in a provisioning error")));
            }
            tx.execute("UPDATE machines SET transient = true WHERE id = $1", &[&id.as_str()]).map_err(pg(ctx))?;
        }
        notify(&mut tx, &uuid, "machines", ids)?;
        tx.commit().map_err(pg(ctx))?;
        self.book.retry_due = true;
        Ok(())
    }
    fn set_constraints(&mut self, id: &MachineId, constraints: &Constraints) -> Result<(), StoreError> {
        let ctx = "changing a machine's constraints";
        let uuid = self.uuid();
        let mut tx = self.begin(ctx)?;
        let row = tx
            .query_opt("SELECT life, manual FROM machines WHERE id = $1 FOR UPDATE", &[&id.as_str()])
            .map_err(pg(ctx))?;
        let Some(row) = row else { return Err(StoreError::NotFound(id.clone())) };
        let (life, manual): (String, bool) = (row.get(0), row.get(1));
        refuse_constraints_change(id, &life, manual)?;
        let constraint = Self::constraint_row(&mut tx, constraints)?;
        tx.execute("UPDATE machines SET constraints_id = $2 WHERE id = $1", &[&id.as_str(), &constraint])
            .map_err(pg(ctx))?;
        notify(&mut tx, &uuid, "machines", std::slice::from_ref(id))?;
        tx.commit().map_err(pg(ctx))?;
        self.book.changed.insert(id.clone());
        Ok(())
    }
    fn settings(&mut self) -> Result<Settings, StoreError> {
        let client = self.client()?;
        let mode = meta_get(client, "harvest_mode").map_err(pg("reading settings"))?;
        let workers = meta_get(client, "workers").map_err(pg("reading settings"))?;
        let mut repair: [Option<String>; 4] = Default::default();
        for (slot, key) in repair.iter_mut().zip(Settings::REPAIR_KEYS) {
            *slot = meta_get(client, key).map_err(pg("reading settings"))?;
        }
        Ok(Settings::from_meta(mode, workers, repair))
    }
    fn set_repair(&mut self, policy: crate::config::repair::RepairPolicy) -> Result<(), StoreError> {
        let ctx = "writing the repair policy";
        let uuid = self.uuid();
        let mut tx = self.begin(ctx)?;
        for (key, value) in Settings::REPAIR_KEYS.iter().zip(Settings::repair_meta(&policy)) {
            meta_set(&mut tx, key, &value).map_err(pg(ctx))?;
        }
        notify(&mut tx, &uuid, "settings", &[])?;
        tx.commit().map_err(pg(ctx))
    }
    fn set_harvest_mode(&mut self, mode: HarvestMode) -> Result<(), StoreError> {
        let ctx = "writing the harvest mode";
        let uuid = self.uuid();
        let mut tx = self.begin(ctx)?;
        meta_set(&mut tx, "harvest_mode", mode.as_str()).map_err(pg(ctx))?;
        notify(&mut tx, &uuid, "settings", &[])?;
        tx.commit().map_err(pg(ctx))
    }
    fn set_workers(&mut self, workers: usize) -> Result<(), StoreError> {
        let ctx = "writing the worker count";
        let uuid = self.uuid();
        let mut tx = self.begin(ctx)?;
        meta_set(&mut tx, "workers", &workers.to_string()).map_err(pg(ctx))?;
        notify(&mut tx, &uuid, "settings", &[])?;
        tx.commit().map_err(pg(ctx))
    }
    fn add_new_machines(&mut self, count: usize, spec: &NewMachine) -> Result<Vec<MachineId>, StoreError> {
        let ctx = "adding machines";
        let uuid = self.uuid();
        let mut tx = self.begin(ctx)?;
        let ids = if count > 0 && spec.constraints.is_empty() {
            // The model's life checked, the ids drawn, the rows inserted and notified by one
            // statement.
            let p = add_many_params(std::iter::once((count, spec)), &uuid);
            let params: Vec<&(dyn ToSql + Sync)> = p.iter().map(|b| &**b as &(dyn ToSql + Sync)).collect();
            let first: i64 = match tx.query_opt(ADD_MANY_SQL, &params).map_err(pg(ctx))? {
                Some(row) => row.try_get(0).map_err(pg(ctx))?,
                None => return Err(StoreError::ModelDying),
            };
            (first..first + count as i64).map(|n| MachineId::from(n.to_string())).collect()
        } else {
            if life_in(&mut tx)? != Life::Alive {
                return Err(StoreError::ModelDying);
            }
            let ids = Self::insert_machines(&mut tx, count, spec)?;
            notify(&mut tx, &uuid, "machines", &ids)?;
            ids
        };
        tx.commit().map_err(pg(ctx))?;
        self.book.added(&ids, MachineStatus::Pending);
        Ok(ids)
    }
    fn add_application(
        &mut self,
        name: &str,
        units: usize,
        constraints: &Constraints,
        capacity: crate::model::CapacityPreference,
    ) -> Result<Vec<MachineId>, StoreError> {
        let ctx = "adding an application";
        let uuid = self.uuid();
        let mut tx = self.begin(ctx)?;
        if life_in(&mut tx)? != Life::Alive {
            return Err(StoreError::ModelDying);
        }
        let constraint = Self::constraint_row(&mut tx, constraints)?;
        let n = tx
            .execute(
                "INSERT INTO applications (name, constraints_id, capacity) VALUES ($1, $2, $3) \
                 ON CONFLICT (name) DO NOTHING",
                &[&name, &constraint, &super::rows::capacity_column(capacity)],
            )
            .map_err(pg(ctx))?;
        if n == 0 {
            return Err(StoreError::Refused(format!("application {name:?} already exists")));
        }
        let spec = NewMachine {
            constraints: constraints.clone(),
            application: Some(name.to_owned()),
            capacity,
            ..NewMachine::default()
        };
        let ids = Self::insert_machines(&mut tx, units, &spec)?;
        notify(&mut tx, &uuid, "machines", &ids)?;
        tx.commit().map_err(pg(ctx))?;
        self.book.added(&ids, MachineStatus::Pending);
        Ok(ids)
    }
    fn applications(&mut self) -> Result<Vec<ApplicationRecord>, StoreError> {
        let ctx = "listing applications";
        let rows = self
            .client()?
            .query(
                "SELECT a.name, c.spec, a.capacity FROM applications a \
                 LEFT JOIN constraints c ON c.id = a.constraints_id ORDER BY a.name",
                &[],
            )
            .map_err(pg(ctx))?;
        let apps: Vec<(String, Option<String>, Option<String>)> =
            rows.iter().map(|r| (r.get(0), r.get(1), r.get(2))).collect();
        apps.into_iter()
            .map(|(name, spec, capacity)| {
                let constraints = spec.and_then(|s| Constraints::parse(&s).ok()).unwrap_or_default();
                let capacity = capacity.and_then(|c| c.parse().ok()).unwrap_or_default();
                let machines = self.application_machines(&name)?;
                Ok(ApplicationRecord { name, constraints, capacity, machines })
            })
            .collect()
    }
    fn application_machines(&mut self, name: &str) -> Result<Vec<MachineId>, StoreError> {
        self.query_ids(
            "reading an application's machines",
            "SELECT id FROM machines WHERE application = $1 AND life != 'dead' ORDER BY seq",
            &[&name],
        )
    }
    fn remove_application(&mut self, name: &str) -> Result<Vec<MachineId>, StoreError> {
        let ctx = "removing an application";
        let uuid = self.uuid();
        let mut tx = self.begin(ctx)?;
        let n = tx.execute("DELETE FROM applications WHERE name = $1", &[&name]).map_err(pg(ctx))?;
        if n == 0 {
            return Err(StoreError::NoApplication(name.to_owned()));
        }
        let rows = tx
            .query(
                "SELECT id, status, life FROM machines WHERE application = $1 AND life != 'dead' ORDER BY seq \
                 FOR UPDATE",
                &[&name],
            )
            .map_err(pg(ctx))?;
        let moved: Vec<(String, String, String)> = rows.iter().map(|r| (r.get(0), r.get(1), r.get(2))).collect();
        tx.execute("UPDATE machines SET life = 'dead' WHERE application = $1 AND life != 'dead'", &[&name])
            .map_err(pg(ctx))?;
        let ids: Vec<MachineId> = moved.iter().map(|(id, _, _)| MachineId::from(id.clone())).collect();
        notify(&mut tx, &uuid, "machines", &ids)?;
        tx.commit().map_err(pg(ctx))?;
        for (_, status, life) in moved {
            self.book.count_machine(Some((status, life)), None, Some(Life::Dead.as_str()));
        }
        self.book.changed.extend(ids.iter().cloned());
        Ok(ids)
    }
    fn add_containers(&mut self, host: &MachineId, kind: &str, count: usize) -> Result<Vec<MachineId>, StoreError> {
        let ctx = "adding containers";
        let uuid = self.uuid();
        let mut tx = self.begin(ctx)?;
        if life_in(&mut tx)? != Life::Alive {
            return Err(StoreError::ModelDying);
        }
        match Self::status_life_in(&mut tx, host)? {
            None => {
                return Err(StoreError::Invalid { field: "host", message: format!("machine {host} does not exist") })
            }
            Some((_, life, _)) if life != Life::Alive.as_str() => {
                return Err(StoreError::Invalid {
                    field: "host",
                    message: format!("machine {host} is {life}: containers need an alive host"),
                })
            }
            Some(_) => {}
        }
        let key = format!("next_container/{host}/{kind}");
        let mut ids = Vec::with_capacity(count);
        for _ in 0..count {
            let n = next_counter(&mut tx, &key).map_err(pg("allocating a container id"))?;
            let seq = next_counter(&mut tx, "next_container_seq").map_err(pg("allocating a container id"))?;
            let id = format!("{host}/{kind}/{n}");
            tx.execute("INSERT INTO machines (seq, id) VALUES ($1, $2)", &[&(CONTAINER_SEQ_BASE + seq), &id])
                .map_err(pg(ctx))?;
            ids.push(MachineId::from(id));
        }
        notify(&mut tx, &uuid, "machines", &ids)?;
        tx.commit().map_err(pg(ctx))?;
        self.book.added(&ids, MachineStatus::Pending);
        Ok(ids)
    }
    fn add_manual(&mut self, address: &str) -> Result<MachineId, StoreError> {
        let ctx = "adding a manual machine";
        let uuid = self.uuid();
        let mut tx = self.begin(ctx)?;
        if life_in(&mut tx)? != Life::Alive {
            return Err(StoreError::ModelDying);
        }
        // One registration of an address at a time, across replicas.
        tx.execute("SELECT pg_advisory_xact_lock(hashtext($1))", &[&address]).map_err(pg(ctx))?;
        let taken = tx
            .query_opt(
                "SELECT id FROM machines WHERE manual AND address = $1 AND life != 'dead' ORDER BY seq LIMIT 1",
                &[&address],
            )
            .map_err(pg(ctx))?;
        if let Some(row) = taken {
            let id: String = row.get(0);
            return Err(StoreError::Invalid {
                field: "address",
                message: format!("{address} is already manual machine {id}"),
            });
        }
        let n = next_counter(&mut tx, "next_machine").map_err(pg("allocating a machine id"))?;
        let id = MachineId::from(n.to_string());
        tx.execute(
            "INSERT INTO machines (seq, id, status, status_message, instance, instance_status, manual, address) \
             VALUES ($1, $2, 'started', $3, $4, $5, true, $6)",
            &[
                &n,
                &id.as_str(),
                &format!("manually provisioned at {address}"),
                &format!("manual:{address}"),
                &InstanceStatus::running().as_str(),
                &address,
            ],
        )
        .map_err(pg(ctx))?;
        notify(&mut tx, &uuid, "machines", std::slice::from_ref(&id))?;
        tx.commit().map_err(pg(ctx))?;
        self.book.added(std::slice::from_ref(&id), MachineStatus::Started);
        Ok(id)
    }
    fn live_containers_of(&mut self, host: &MachineId) -> Result<Vec<MachineId>, StoreError> {
        let prefix = format!("{host}/");
        let ids = self.query_ids(
            "listing containers",
            "SELECT id FROM machines WHERE starts_with(id, $1) AND life != 'dead' ORDER BY seq",
            &[&prefix],
        )?;
        Ok(ids.into_iter().filter(|c| c.container_of().is_some_and(|(h, _)| &h == host)).collect())
    }
    fn machines_in_error(&mut self) -> Result<u64, StoreError> {
        count_in_error(self.client()?)
    }
    fn live_manual_machines(&mut self) -> Result<Vec<MachineId>, StoreError> {
        self.query_ids(
            "listing manual machines",
            "SELECT id FROM machines WHERE manual AND life != 'dead' ORDER BY seq",
            &[],
        )
    }

    fn create_instance(
        &mut self,
        client_token: &str,
        zone: Option<&str>,
        tags: &InstanceTags,
    ) -> Result<(InstanceRecord, bool), StoreError> {
        self.create_instance_in(client_token, zone, tags, InstanceState::Pending)
    }
    fn create_running_instance(
        &mut self,
        client_token: &str,
        zone: Option<&str>,
        tags: &InstanceTags,
    ) -> Result<(InstanceRecord, bool), StoreError> {
        // Created running by the one insert: no landing's round trip after it.
        self.create_instance_in(client_token, zone, tags, InstanceState::Running)
    }
    #[cfg(test)]
    fn instance(&mut self, id: &InstanceId) -> Result<Option<InstanceRecord>, StoreError> {
        let row = self
            .client()?
            .query_opt(&format!("SELECT {INSTANCE_COLUMNS} FROM instances WHERE id = $1"), &[&id.as_str()])
            .map_err(pg("reading an instance"))?;
        row.as_ref().map(instance_from_row).transpose()
    }
    fn land_instance(&mut self, id: &InstanceId) -> Result<Option<InstanceRecord>, StoreError> {
        let ctx = "landing an instance";
        let key = id.as_str();
        let mut tx = self.begin(ctx)?;
        // Landed and read back in one round trip.
        let replies = tx
            .pipeline(&[
                ("UPDATE instances SET state = 'running' WHERE id = $1 AND state = 'pending'", &[&key], false),
                (&format!("SELECT {INSTANCE_COLUMNS} FROM instances WHERE id = $1"), &[&key], true),
            ])
            .map_err(pg(ctx))?;
        tx.commit().map_err(pg(ctx))?;
        let mut replies = replies.into_iter();
        if replies.next().is_some_and(|n| n.count() > 0) {
            self.book.instance_moved(Some(InstanceState::Pending.as_str()), InstanceState::Running.as_str());
        }
        replies.next().map(Reply::into_rows).unwrap_or_default().first().map(instance_from_row).transpose()
    }
    #[cfg(test)]
    fn all_instances(&mut self) -> Result<Vec<InstanceRecord>, StoreError> {
        let rows = self
            .client()?
            .query(&format!("SELECT {INSTANCE_COLUMNS} FROM instances ORDER BY seq"), &[])
            .map_err(pg("listing instances"))?;
        rows.iter().map(instance_from_row).collect()
    }
    fn live_instances(&mut self, model: &str) -> Result<Vec<CloudInstance>, StoreError> {
        let rows = self
            .client()?
            .query(
                &format!(
                    "SELECT {INSTANCE_COLUMNS} FROM instances WHERE model = $1 AND state != 'terminated' ORDER BY seq"
                ),
                &[&model],
            )
            .map_err(pg("listing instances"))?;
        rows.iter().map(|r| instance_from_row(r).map(|i| i.instance)).collect()
    }
    fn terminate_instances(&mut self, ids: &[InstanceId]) -> Result<(), StoreError> {
        let ctx = "terminating instances";
        let mut tx = self.begin(ctx)?;
        let mut moved = Vec::new();
        for id in ids.iter().collect::<std::collections::BTreeSet<_>>() {
            let row = tx
                .query_opt(
                    "UPDATE instances i SET state = 'terminated' FROM (SELECT id, state FROM instances WHERE id = $1 \
                     FOR UPDATE) old WHERE i.id = old.id AND old.state != 'terminated' RETURNING old.state",
                    &[&id.as_str()],
                )
                .map_err(pg(ctx))?;
            if let Some(row) = row {
                moved.push(row.get::<_, String>(0));
            }
        }
        tx.commit().map_err(pg(ctx))?;
        for state in moved {
            self.book.instance_moved(Some(&state), InstanceState::Terminated.as_str());
        }
        Ok(())
    }
    fn release_instances(&mut self, ids: &[InstanceId]) -> Result<(), StoreError> {
        let ctx = "releasing instances";
        let mut tx = self.begin(ctx)?;
        for id in ids {
            tx.execute("UPDATE instances SET model = NULL WHERE id = $1", &[&id.as_str()]).map_err(pg(ctx))?;
        }
        tx.commit().map_err(pg(ctx))
    }
    fn retag_instance(&mut self, id: &InstanceId, tags: &InstanceTags) -> Result<bool, StoreError> {
        let ctx = "retagging an instance";
        let mut tx = self.begin(ctx)?;
        let n = tx
            .execute(
                "UPDATE instances SET model = $2, machine = $3, start = $4 WHERE id = $1 AND state != 'terminated'",
                &[&id.as_str(), &tags.model, &tags.machine.as_ref().map(MachineId::as_str), &tags.start],
            )
            .map_err(pg(ctx))?;
        tx.commit().map_err(pg(ctx))?;
        Ok(n > 0)
    }
    fn pending_instances(&mut self) -> Result<Vec<InstanceId>, StoreError> {
        let ctx = "listing pending instances";
        let rows = self
            .client()?
            .query("SELECT id FROM instances WHERE state = 'pending' ORDER BY seq", &[])
            .map_err(pg(ctx))?;
        rows.iter().map(|r| r.try_get::<_, String>(0).map(InstanceId::from).map_err(pg(ctx))).collect()
    }

    fn put_start_intent(&mut self, client_token: &str, machine: &MachineId, params: &str) -> Result<(), StoreError> {
        let ctx = "writing a start's intent";
        let mut tx = self.begin(ctx)?;
        tx.execute(
            "INSERT INTO start_intents (client_token, machine, params) VALUES ($1, $2, $3) \
             ON CONFLICT (client_token) DO NOTHING",
            &[&client_token, &machine.as_str(), &params],
        )
        .map_err(pg(ctx))?;
        tx.commit().map_err(pg(ctx))
    }
    fn drop_start_intent(&mut self, client_token: &str) -> Result<(), StoreError> {
        let ctx = "dropping a start's intent";
        let mut tx = self.begin(ctx)?;
        tx.execute("DELETE FROM start_intents WHERE client_token = $1", &[&client_token]).map_err(pg(ctx))?;
        tx.commit().map_err(pg(ctx))
    }
    fn start_intents(&mut self) -> Result<Vec<String>, StoreError> {
        let ctx = "reading the start intents";
        let rows = self.client()?.query("SELECT params FROM start_intents ORDER BY seq", &[]).map_err(pg(ctx))?;
        rows.iter().map(|r| r.try_get(0).map_err(pg(ctx))).collect()
    }
    fn create_token(
        &mut self,
        scope: Scope,
        model: Option<(&str, &str)>,
        sha256: &str,
        created: &str,
    ) -> Result<TokenRecord, StoreError> {
        let ctx = "creating an API token";
        let (name, uuid) = (model.map(|m| m.0), model.map(|m| m.1));
        let mut tx = self.begin_with(ctx, None)?;
        let id = token_id(next_counter(&mut tx, "next_token").map_err(pg(ctx))? as u64 + 1);
        tx.execute(
            "INSERT INTO api_tokens (id, scope, sha256, created, model, model_uuid) VALUES ($1, $2, $3, $4, $5, $6)",
            &[&id, &scope.as_str(), &sha256, &created, &name, &uuid],
        )
        .map_err(pg(ctx))?;
        tx.commit().map_err(pg(ctx))?;
        Ok(TokenRecord::created(id, scope, created, model))
    }
    fn revoke_model_tokens(&mut self, name: &str, uuid: &str, at: &str) -> Result<Vec<TokenRecord>, StoreError> {
        let ctx = "revoking a destroyed model's API tokens";
        let mut tx = self.begin_with(ctx, None)?;
        let rows = tx
            .query(
                &format!(
                    "UPDATE api_tokens SET revoked = $3 WHERE revoked IS NULL \
                     AND (model_uuid = $2 OR (model_uuid IS NULL AND model = $1)) RETURNING {TOKEN_COLUMNS}"
                ),
                &[&name, &uuid, &at],
            )
            .map_err(pg(ctx))?;
        tx.commit().map_err(pg(ctx))?;
        let mut tokens = rows.iter().map(|r| token_from_row(r, ctx)).collect::<Result<Vec<_>, _>>()?;
        tokens.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(tokens)
    }
    fn tokens(&mut self) -> Result<Vec<TokenRecord>, StoreError> {
        let ctx = "listing API tokens";
        let rows = self
            .client()?
            .query(&format!("SELECT {TOKEN_COLUMNS} FROM api_tokens ORDER BY seq"), &[])
            .map_err(pg(ctx))?;
        rows.iter().map(|r| token_from_row(r, ctx)).collect()
    }
    fn token_by_hash(&mut self, sha256: &str) -> Result<Option<TokenRecord>, StoreError> {
        let ctx = "looking up an API token";
        let row = self
            .client()?
            .query_opt(&format!("SELECT {TOKEN_COLUMNS} FROM api_tokens WHERE sha256 = $1"), &[&sha256])
            .map_err(pg(ctx))?;
        row.map(|r| token_from_row(&r, ctx)).transpose()
    }
    fn revoke_token(&mut self, id: &str, at: &str) -> Result<TokenRecord, StoreError> {
        let ctx = "revoking an API token";
        let mut tx = self.begin_with(ctx, None)?;
        tx.execute("UPDATE api_tokens SET revoked = $2 WHERE id = $1 AND revoked IS NULL", &[&id, &at])
            .map_err(pg(ctx))?;
        let row =
            tx.query_opt(&format!("SELECT {TOKEN_COLUMNS} FROM api_tokens WHERE id = $1"), &[&id]).map_err(pg(ctx))?;
        tx.commit().map_err(pg(ctx))?;
        token_from_row(&row.ok_or_else(|| StoreError::NoToken(id.to_owned()))?, ctx)
    }
}

/// The machines in error (the rows of `machine_errors`, kept by triggers), on `conn` as it is.
fn count_in_error(conn: &mut Conn) -> Result<u64, StoreError> {
    let n: i64 = conn
        .query_one("SELECT count(*) FROM machine_errors", &[])
        .and_then(|r| r.try_get(0).map_err(CallError::from))
        .map_err(pg("counting machines in error"))?;
    Ok(n as u64)
}
