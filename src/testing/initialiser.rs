//! A fake container initialiser with scripted failures.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::Arc;

use futures::future::BoxFuture;

use crate::containers::{ContainerInitialiser, InitialiseError};
use crate::model::MachineId;

/// Succeeds, except for the first `times` calls per scripted host and type.
#[derive(Clone, Default)]
pub struct FakeInitialiser {
    faults: Arc<BTreeMap<(String, String), (AtomicU32, String)>>,
    calls: Arc<AtomicUsize>,
}

impl FakeInitialiser {
    /// Fails the first `times` initialisations of `kind` on `host` with `message` for each
    /// `(host, kind, times, message)`.
    pub fn new(faults: Vec<(String, String, u32, String)>) -> Self {
        let faults = faults.into_iter().map(|(h, k, n, m)| ((h, k), (AtomicU32::new(n), m))).collect();
        Self { faults: Arc::new(faults), calls: Arc::new(AtomicUsize::new(0)) }
    }

    /// How many initialisations were asked for.
    pub fn calls(&self) -> usize {
        self.calls.load(Ordering::Relaxed)
    }
}

impl ContainerInitialiser for FakeInitialiser {
    fn initialise(&self, host: MachineId, kind: String) -> BoxFuture<'static, Result<(), InitialiseError>> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        let result = match self.faults.get(&(host.to_string(), kind)) {
            Some((left, message)) if left.load(Ordering::Relaxed) > 0 => {
                left.fetch_sub(1, Ordering::Relaxed);
                Err(InitialiseError::new(message.clone()))
            }
            _ => Ok(()),
        };
        Box::pin(async move { result })
    }
}
