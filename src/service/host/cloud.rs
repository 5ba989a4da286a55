//! A model's settings: the service's, with the model's cloud applied ([`model_settings`]), and
//! the broker it uses ([`broker_of`]).

use super::directory::{CloudSettings, ModelEntry, DEFAULT_MODEL};
use crate::service::runtime::{schema_name, schema_url};
use crate::service::settings::{BrokerKind, ServeSettings, StoreUrl};

/// The settings model `entry` runs with: the service's, with the model's cloud applied, and
/// (PostgreSQL) its own schema in the store's URL.
pub(crate) fn model_settings(opts: &ServeSettings, entry: &ModelEntry) -> ServeSettings {
    let mut o = opts.clone();
    let c = &entry.cloud;
    if let Some(b) = c.broker.as_deref() {
        o.broker = Some(match b {
            "ec2" => BrokerKind::Ec2,
            "lxd" => BrokerKind::Lxd,
            _ => BrokerKind::Sim,
        });
    }
    if let Some(z) = &c.zones {
        o.sim.zones = Some(z.clone());
        // The service's subnets name the service's zones: a model with zones of its own gets
        // the default subnet per zone.
        o.sim.subnets = None;
        o.sim.unavailable_zones.clear();
    }
    if let Some(r) = &c.region {
        o.ec2.region = Some(r.clone());
    }
    if let Some(e) = &c.endpoint {
        o.ec2.endpoint = Some(e.clone());
    }
    if let Some(i) = &c.image {
        o.ec2.image = Some(i.clone());
    }
    if let Some(l) = &c.lxd {
        o.lxd = l.over(&opts.lxd);
    }
    if entry.name != DEFAULT_MODEL {
        // The interruption queue is the default model's alone: a provisioner acknowledges (so
        // deletes) the notices of instances that are not its model's, so two models reading
        // one queue would lose each other's warnings.
        o.ec2.interruption_queue = None;
        if let StoreUrl::Postgres(url) = opts.store.url() {
            o.store.url = Some(StoreUrl::Postgres(schema_url(&url, &schema_name(&entry.name))));
        }
    }
    o
}

/// The broker a model uses, resolved: its own, else the service's.
pub(crate) fn broker_of(opts: &ServeSettings, cloud: &CloudSettings) -> String {
    cloud.broker.clone().unwrap_or_else(|| match opts.broker() {
        BrokerKind::Sim => "sim".to_owned(),
        BrokerKind::Ec2 => "ec2".to_owned(),
        BrokerKind::Lxd => "lxd".to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_models_settings_are_the_services_with_its_cloud() {
        let opts = ServeSettings::default();
        let entry = ModelEntry::new(
            "b",
            CloudSettings { zones: Some(vec!["x1".into(), "x2".into()]), ..CloudSettings::default() },
        );
        let o = model_settings(&opts, &entry);
        assert_eq!(o.sim.zones(), ["x1", "x2"]);
        assert_eq!(o.sim.subnets().keys().collect::<Vec<_>>(), ["subnet-x1", "subnet-x2"]);
        assert_eq!(broker_of(&opts, &entry.cloud), "sim");
        let ec2 = CloudSettings { broker: Some("ec2".into()), region: Some("eu-west-1".into()), ..Default::default() };
        let o = model_settings(&opts, &ModelEntry::new("c", ec2));
        assert_eq!(o.broker(), BrokerKind::Ec2);
        assert_eq!(o.ec2.region.as_deref(), Some("eu-west-1"));
    }
}
