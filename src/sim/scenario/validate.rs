//! The checks a parser cannot make alone, each a small named function: settings that must go
//! together, machine ids that are well-formed, unique and known where they are named, container
//! ids whose type and host exist, and events with exactly one action. The first failing check
//! is the error, located at the value it is about.

use super::events::Action;
use super::location::Locations;
use super::spec::{MachineSpec, SetConstraintsSpec, SetLifeSpec, SetStatusSpec};
use super::units::format_duration;
use super::{EventSpec, Scenario, ScenarioError};

/// Runs every check in order; the first failure is the error.
pub(super) fn validate(s: &Scenario, loc: &Locations, file: &str) -> Result<(), ScenarioError> {
    let c = Checks { s, loc, file };
    c.reuse_needs_harvesting()?;
    c.mutations_the_simulator_runs()?;
    c.batch_size_in_range()?;
    c.drift_budget_positive()?;
    c.machine_ids_are_valid_and_unique()?;
    let known = c.known_machines();
    c.containers_have_a_type_and_host(&known)?;
    c.faults_name_known_machines(&known)?;
    c.placements_are_directives()?;
    for (i, e) in s.events.iter().enumerate() {
        c.event(i, e, &known)?;
    }
    Ok(())
}

struct Checks<'a> {
    s: &'a Scenario,
    loc: &'a Locations,
    file: &'a str,
}

impl Checks<'_> {
    /// An error about the value at `path`, naming `field`.
    fn err(&self, path: &str, field: &str, message: String) -> ScenarioError {
        ScenarioError { file: self.file.to_owned(), line: self.loc.line(path), field: format!("{field}: "), message }
    }

    /// Reuse parks dead machines' instances, which only a mode that harvests them can do.
    fn reuse_needs_harvesting(&self) -> Result<(), ScenarioError> {
        let p = &self.s.provisioner;
        if p.reuse && !p.harvest_mode.harvests_destroyed() {
            let message = crate::config::ConfigError::Reuse(p.harvest_mode).to_string();
            return Err(self.err("provisioner.reuse", "reuse", message));
        }
        Ok(())
    }

    /// The mutations of the service's protocol (the lease's fence, the start intents) break
    /// code the simulator does not run: a scenario that names one would change nothing.
    fn mutations_the_simulator_runs(&self) -> Result<(), ScenarioError> {
        let m = &self.s.provisioner.mutations;
        let service_only = [("skip-fence-check", m.skip_fence_check), ("no-start-intents", m.no_start_intents)];
        if let Some((name, _)) = service_only.into_iter().find(|(_, on)| *on) {
            let message = format!(
                "mutation {name} breaks the service's protocol (the lease, the start intents), which the simulator \
                 does not run; the model checker's configurations with `service` check it"
            );
            return Err(self.err("provisioner.mutations", "mutations", message));
        }
        Ok(())
    }

    /// A batch carries at least one machine and at most the configured bound.
    fn batch_size_in_range(&self) -> Result<(), ScenarioError> {
        let n = self.s.provisioner.batch_size;
        if n == 0 || n > crate::config::MAX_BATCH_SIZE {
            let message =
                crate::config::ConfigError::BatchSize { value: n, max: crate::config::MAX_BATCH_SIZE }.to_string();
            return Err(self.err("provisioner.batch_size", "batch_size", message));
        }
        Ok(())
    }

    /// A drift budget replaces at least one machine at a time.
    fn drift_budget_positive(&self) -> Result<(), ScenarioError> {
        let n = self.s.provisioner.drift_budget;
        if n == 0 {
            let message = crate::config::repair::RepairError::DriftBudget(n.to_string()).to_string();
            return Err(self.err("provisioner.drift_budget", "drift_budget", message));
        }
        Ok(())
    }

    fn machine_ids_are_valid_and_unique(&self) -> Result<(), ScenarioError> {
        for (i, m) in self.s.machines.iter().enumerate() {
            let path = format!("machines[{i}].id");
            if self.s.machines[..i].iter().any(|x| x.id == m.id) {
                return Err(self.err(&path, "id", format!("machine id {:?} appears twice", m.id)));
            }
            validate_machine_id(&m.id).map_err(|e| self.err(&path, "id", e))?;
        }
        Ok(())
    }

    /// The machines at the start and those events add.
    fn known_machines(&self) -> Vec<&str> {
        let added = self.s.events.iter().filter_map(|e| e.add_machine.as_ref());
        self.s.machines.iter().chain(added).map(|m| m.id.as_str()).collect()
    }

    /// Every machine with the path of its id: those at the start, then those events add.
    fn machines_with_paths(&self) -> impl Iterator<Item = (String, &MachineSpec)> {
        let start = self.s.machines.iter().enumerate().map(|(i, m)| (format!("machines[{i}].id"), m));
        let added = self.s.events.iter().enumerate().filter_map(|(i, e)| {
            let m = e.add_machine.as_ref()?;
            Some((format!("events[{i}].add_machine.id"), m))
        });
        start.chain(added)
    }

    fn containers_have_a_type_and_host(&self, known: &[&str]) -> Result<(), ScenarioError> {
        let types = crate::containers::DEFAULT_CONTAINER_TYPES;
        for (path, m) in self.machines_with_paths() {
            let id = m.id.as_str();
            let mid = crate::model::MachineId::new(id);
            let Some((host, kind)) = mid.container_of() else { continue };
            if !types.contains(&kind) {
                let message = format!("unknown container type {kind:?} in {id:?}; supported: {}", types.join(", "));
                return Err(self.err(&path, "id", message));
            }
            if !known.contains(&host.as_str()) {
                let message = format!("container {id:?} names unknown host {:?}", host.as_str());
                return Err(self.err(&path, "id", message));
            }
        }
        Ok(())
    }

    /// Placements are `zone=NAME` or `subnet=ID` (an unknown subnet is not refused here: it
    /// is the machine's provisioning failure, as in the service).
    fn placements_are_directives(&self) -> Result<(), ScenarioError> {
        for (path, m) in self.machines_with_paths() {
            if let Some(p) = &m.placement {
                let path = path.replace(".id", ".placement");
                crate::model::Placement::parse(p).map_err(|e| self.err(&path, "placement", e.to_string()))?;
            }
        }
        Ok(())
    }

    /// Scripted start faults and derived zones name machines that exist.
    fn faults_name_known_machines(&self, known: &[&str]) -> Result<(), ScenarioError> {
        let cloud = &self.s.cloud;
        if let Some(i) =
            cloud.faults.iter().position(|f| f.machine.is_empty() && f.instance_type.is_none() && !f.spot_capacity)
        {
            let message = "a fault names a machine, an instance_type, or both (or is a spot_capacity fault)".to_owned();
            return Err(self.err(&format!("cloud.faults[{i}]"), "fault", message));
        }
        for (i, f) in cloud.faults.iter().enumerate().filter(|(_, f)| f.partial.is_some()) {
            if f.lost_response || f.zone_independent || f.instance_type.is_some() {
                let path = format!("cloud.faults[{i}].partial");
                let message = "a partial launch is a capacity fault of a whole call: it cannot be lost_response, \
                               zone_independent or of an instance_type"
                    .to_owned();
                return Err(self.err(&path, "partial", message));
            }
        }
        for (i, f) in cloud.faults.iter().enumerate().filter(|(_, f)| f.spot_capacity) {
            if f.lost_response || f.zone_independent || f.partial.is_some() {
                let path = format!("cloud.faults[{i}].spot_capacity");
                let message = "a spot_capacity fault is a capacity fault of spot starts: it cannot be lost_response, \
                               zone_independent or partial"
                    .to_owned();
                return Err(self.err(&path, "spot_capacity", message));
            }
        }
        for (i, f) in cloud.faults.iter().enumerate().filter(|(_, f)| f.instance_type.is_some()) {
            if f.lost_response || f.zone_independent {
                let path = format!("cloud.faults[{i}].instance_type");
                let message =
                    "a fault of an instance type is a capacity fault: it cannot be lost_response or zone_independent"
                        .to_owned();
                return Err(self.err(&path, "instance_type", message));
            }
        }
        let faults = cloud
            .faults
            .iter()
            .enumerate()
            .filter(|(_, f)| !(f.machine.is_empty() && (f.instance_type.is_some() || f.spot_capacity)))
            .map(|(i, f)| ("faults", "fault", i, &f.machine));
        let derived =
            cloud.derived_zones.iter().enumerate().map(|(i, d)| ("derived_zones", "derived_zones", i, &d.machine));
        for (table, what, i, machine) in faults.chain(derived) {
            if !known.contains(&machine.as_str()) {
                let path = format!("cloud.{table}[{i}].machine");
                return Err(self.err(&path, "machine", format!("{what} names unknown machine {machine:?}")));
            }
        }
        Ok(())
    }

    /// One event: exactly one action, whose machine ids exist (or, for `add_machine`, are new
    /// and well-formed).
    fn event(&self, i: usize, e: &EventSpec, known: &[&str]) -> Result<(), ScenarioError> {
        let action =
            e.action().map_err(|err| self.err(&format!("events[{i}].at"), &format!("events[{i}]"), err.to_string()))?;
        let key = action.key();
        let path = format!("events[{i}].{key}");
        let unknown = |at: String, id: &str| {
            self.err(&at, key, format!("unknown machine id {id:?} in event {i} (at {})", format_duration(e.at.0)))
        };
        match &action {
            Action::SetLife(SetLifeSpec { machine, .. }) | Action::SetStatus(SetStatusSpec { machine, .. })
                if !known.contains(&machine.as_str()) =>
            {
                Err(unknown(format!("{path}.machine"), machine))
            }
            Action::SetConstraints(SetConstraintsSpec { machine, .. }) if !known.contains(&machine.as_str()) => {
                Err(unknown(format!("{path}.machine"), machine))
            }
            Action::SetConstraints(SetConstraintsSpec { constraints, .. }) => {
                crate::model::Constraints::parse(constraints)
                    .map(drop)
                    .map_err(|e| self.err(&format!("{path}.constraints"), key, e.to_string()))
            }
            Action::RetryProvisioning(ids) => match ids.iter().position(|id| !known.contains(&id.as_str())) {
                Some(j) => Err(unknown(format!("{path}[{j}]"), &ids[j])),
                None => Ok(()),
            },
            Action::AddMachine(m) => {
                validate_machine_id(&m.id).map_err(|msg| self.err(&path, key, msg))?;
                if self.s.machines.iter().any(|x| x.id == m.id) {
                    return Err(self.err(&path, key, format!("machine id {:?} already exists", m.id)));
                }
                Ok(())
            }
            Action::Restart if e.restart == Some(false) => Err(self.err(&path, key, "restart takes `true`".into())),
            _ => Ok(()),
        }
    }
}

/// A machine id is a number (`"3"`) or a container (`"0/lxd/1"`: host, type, number).
fn validate_machine_id(id: &str) -> Result<(), String> {
    let number = |s: &str| !s.is_empty() && s.chars().all(|c| c.is_ascii_digit());
    let ok = match id.split('/').collect::<Vec<_>>().as_slice() {
        [n] => number(n),
        [h, t, n] => number(h) && !t.is_empty() && t.chars().all(|c| c.is_ascii_lowercase()) && number(n),
        _ => false,
    };
    if ok {
        Ok(())
    } else {
        Err(format!("invalid machine id {id:?}: expected a number like \"3\" or a container like \"0/lxd/1\""))
    }
}
