//! An actix-based controller embedding the provisioner, with the fake cloud and fake model
//! standing in for a real cloud and a real model (feature `test-util`).
//!
//! The controller actor subscribes to provisioner events, adds machines to its model, kills
//! one once everything is up, and stops the system when the dead machine is removed.
//!
//! Run it with `cargo run --features test-util --example embed`.

use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use provisioner::testing::{FakeCloud, FakeMachine, FakeModel};
use provisioner::{start, HarvestMode, Life, Machine, ProvisionerConfig, ProvisionerEvent, ProvisionerHandle};

/// The embedding controller: owns the model, reacts to provisioner events.
struct Controller {
    model: FakeModel,
    cloud: FakeCloud,
    provisioner: ProvisionerHandle,
    started: usize,
    machines: usize,
}

impl Actor for Controller {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        self.provisioner.subscribe(ctx.address().recipient());
        // Connect the model's watchers: the first notification carries every machine.
        self.model.watch(self.provisioner.machines_changed());
        self.model.watch_retries(self.provisioner.retry_ticks());
        for i in 0..self.machines {
            self.model.add_machine(FakeMachine::new(Machine::pending(i.to_string().as_str())));
        }
    }
}

impl Handler<ProvisionerEvent> for Controller {
    type Result = ();

    fn handle(&mut self, event: ProvisionerEvent, ctx: &mut Self::Context) {
        match &event {
            ProvisionerEvent::MachineStarted { machine, instance, zone } => {
                println!("machine {machine} started as {instance} in {}", zone.as_deref().unwrap_or("-"));
                self.started += 1;
                if self.started == self.machines {
                    println!("all {} machines are up; destroying machine 0", self.machines);
                    self.model.set_life("0", Life::Dead);
                }
            }
            ProvisionerEvent::InstancesStopped { instances } => println!("stopped {instances:?}"),
            ProvisionerEvent::MachineRemoved { machine } => {
                println!("machine {machine} removed");
                let (model, cloud) = (self.model.clone(), self.cloud.clone());
                ctx.spawn(
                    async move {
                        let m = model.snapshot().await;
                        let c = cloud.snapshot().await;
                        let live = c.instances.values().filter(|i| i.instance.state.as_str() != "terminated").count();
                        println!(
                            "model: {} machines, {} removed; cloud: {live} live instances",
                            m.machines.len(),
                            m.marked_for_removal.len()
                        );
                        System::current().stop();
                    }
                    .into_actor(self),
                );
            }
            other => println!("event: {}", other.name()),
        }
    }
}

fn main() {
    let system = System::new();
    system.block_on(async {
        let config =
            ProvisionerConfig { harvest_mode: HarvestMode::Destroyed, workers: 4, ..ProvisionerConfig::default() };
        let cloud = FakeCloud::with_zones(&config.model_uuid, &["az1", "az2", "az3"]);
        cloud.set_latency(Duration::from_millis(200), Duration::from_millis(50));
        let model = FakeModel::new(vec![]);
        let provisioner = start(config, Arc::new(cloud.broker()), Arc::new(model.api())).expect("valid configuration");
        Controller { model, cloud, provisioner, started: 0, machines: 6 }.start();
    });
    system.run().expect("system runs");
}
