//! The [`ModelApi`] over the store: the provisioner reads and writes the model in the
//! database. Each write has committed when its future resolves; the provisioner's own writes
//! are not fsynced one by one (they survive a process crash, and what a power cut could take
//! is re-derived at the next start), the model's destruction is.

use crate::model::{InstanceStatus, Life, Machine, MachineId, MachineStatus, ProvisioningInfo};
use crate::ports::{ModelApi, ModelError, ModelFuture, ProvisionedInstance};
use crate::service::store::{Store, StoreError, Write};

/// The model in the service's database.
#[derive(Clone)]
pub(crate) struct StoreModel {
    store: Store,
}

impl StoreModel {
    /// The model API over this store.
    pub(crate) fn new(store: Store) -> Self {
        Self { store }
    }
}

/// How a store failure reads to the provisioner.
pub(super) fn model_error(e: StoreError) -> ModelError {
    match e {
        StoreError::NotFound(id) => ModelError::NotFound(id),
        StoreError::ModelDying => ModelError::ModelDying,
        e @ StoreError::Fenced { .. } => ModelError::Fenced(e.to_string()),
        other => ModelError::Other(other.to_string()),
    }
}

/// What an instance-status write says about a start attempt, as the provisioner reports its
/// starts through the model port: the start worker writes `provisioning` "starting" before its
/// first cloud call (no outcome yet), `provisioning` with a message after each failed attempt
/// it retries (a new round or another zone), and `provisioning error` when the start failed
/// for good. `Some(message)`: one failed attempt with that error; `None`: no attempt's outcome.
/// A success is the instance being recorded (`set_instance_info`). Throttled calls the
/// provisioner waits out are not reported, so not counted.
pub(super) fn failed_start_attempt<'a>(status: &InstanceStatus, message: &'a str) -> Option<&'a str> {
    let retried = status.is_provisioning() && !message.is_empty() && message != STARTING;
    (retried || status.is_error()).then_some(message)
}

/// The message of the instance status a start worker writes before its first cloud call.
const STARTING: &str = "starting";

fn per_id<T>(ids: &[MachineId], found: Vec<Option<T>>) -> Vec<Result<T, ModelError>> {
    ids.iter().zip(found).map(|(id, m)| m.ok_or_else(|| ModelError::NotFound(id.clone()))).collect()
}

impl StoreModel {
    /// The provisioner's own reads and writes: lazy commits (see [`Store::exec_lazy`]).
    fn run<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut dyn crate::service::store::StoreBackend) -> Result<T, StoreError> + Send + 'static,
    ) -> ModelFuture<T> {
        let fut = self.store.exec_lazy(f);
        Box::pin(async move { fut.await.map_err(model_error) })
    }

    /// The provisioner's hot writes, given as data (see [`Store::write_behind`]): a backend
    /// may send them with their group's commit instead of one round trip each.
    fn write(&self, write: Write) -> ModelFuture<()> {
        let fut = self.store.write_behind(write);
        Box::pin(async move { fut.await.map(|_| ()).map_err(model_error) })
    }
}

impl ModelApi for StoreModel {
    fn machines(&self, ids: Vec<MachineId>) -> ModelFuture<Vec<Result<Machine, ModelError>>> {
        self.run(move |s| {
            let found = s.model_machines(&ids)?;
            Ok(per_id(&ids, found))
        })
    }
    fn machines_with_transient_errors(&self) -> ModelFuture<Vec<Machine>> {
        self.run(|s| s.transient_errors())
    }
    fn provisioning_info(&self, ids: Vec<MachineId>) -> ModelFuture<Vec<Result<ProvisioningInfo, ModelError>>> {
        self.run(move |s| Ok(per_id(&ids, s.provisioning_info(&ids)?)))
    }
    fn distribution_groups(&self, ids: Vec<MachineId>) -> ModelFuture<Vec<Result<Vec<MachineId>, ModelError>>> {
        // The machines hosting one application's units form its distribution group.
        self.run(move |s| Ok(per_id(&ids, s.distribution_groups(&ids)?)))
    }
    fn set_instance_info(&self, id: MachineId, info: ProvisionedInstance) -> ModelFuture<()> {
        self.write(Write::StartedInstance { id, info })
    }
    fn set_status(&self, id: MachineId, status: MachineStatus, message: String) -> ModelFuture<()> {
        self.write(Write::MachineStatus { id, status, message })
    }
    fn set_instance_status(&self, id: MachineId, status: InstanceStatus, message: String) -> ModelFuture<()> {
        let failed_attempt = failed_start_attempt(&status, &message).map(str::to_owned);
        self.write(Write::InstanceStatus { id, status, message, failed_attempt })
    }
    fn ensure_dead(&self, id: MachineId) -> ModelFuture<()> {
        self.run(move |s| s.ensure_dead(&id))
    }
    fn mark_for_removal(&self, id: MachineId) -> ModelFuture<()> {
        self.run(move |s| s.mark_for_removal(&id))
    }
    fn availability_zone(&self, id: MachineId) -> ModelFuture<Option<String>> {
        self.run(move |s| s.availability_zone(&id))
    }
    fn model_life(&self) -> ModelFuture<Life> {
        self.run(|s| s.model_life())
    }
    fn destroy_model(&self) -> ModelFuture<Vec<Machine>> {
        // An operator's request: on disk before the answer.
        let fut = self.store.exec(|s| s.destroy_model());
        Box::pin(async move { fut.await.map_err(model_error) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failed_attempts_are_the_retried_and_final_failures() {
        let p = InstanceStatus::provisioning();
        assert_eq!(failed_start_attempt(&p, "starting"), None, "before the first call");
        assert_eq!(failed_start_attempt(&p, ""), None, "a reset for a retry");
        assert_eq!(
            failed_start_attempt(&p, "failed to start machine 0 (boom), retrying"),
            Some("failed to start machine 0 (boom), retrying")
        );
        assert_eq!(failed_start_attempt(&InstanceStatus::provisioning_error(), "boom"), Some("boom"));
        assert_eq!(failed_start_attempt(&InstanceStatus::running(), ""), None);
        assert_eq!(failed_start_attempt(&InstanceStatus::other("missing"), "instance i-1 is not in the cloud"), None);
    }
}
