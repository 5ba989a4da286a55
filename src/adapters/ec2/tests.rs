//! Unit tests of the EC2 broker's pure parts: error mapping, tokens, instance mapping, config.

use std::time::{Duration, SystemTime};

use aws_sdk_ec2::types::{Instance, InstanceState as AwsState, InstanceStateName, Placement, Tag};

use super::broker::{identity_tags, to_cloud_instance, with_shared_tags};
use super::*;
use crate::model::InstanceState;
use crate::ports::BrokerError;

#[test]
fn errors_map_onto_failure_kinds_with_the_aws_message() {
    let capacity = classify(Some("InsufficientInstanceCapacity"), "no m5.large in us-east-1a", Some("us-east-1a"));
    assert_eq!(capacity, BrokerError::zone_specific("InsufficientInstanceCapacity: no m5.large in us-east-1a"));
    assert!(matches!(classify(Some("Unsupported"), "x", Some("az1")), BrokerError::ZoneSpecific { .. }));
    assert!(matches!(
        classify(Some("InvalidParameterValue"), "Invalid availability zone: [us-east-1x]", Some("us-east-1x")),
        BrokerError::ZoneSpecific { .. }
    ));
    assert!(matches!(
        classify(Some("InvalidParameterValue"), "Invalid value for instance type", Some("us-east-1a")),
        BrokerError::ZoneIndependent { .. }
    ));
    for code in ["RequestLimitExceeded", "Throttling", "ThrottlingException"] {
        assert!(matches!(classify(Some(code), "slow down", None), BrokerError::Throttled { .. }), "{code}");
    }
    for code in
        ["UnauthorizedOperation", "AuthFailure", "InstanceLimitExceeded", "VcpuLimitExceeded", "InvalidAMIID.NotFound"]
    {
        let e = classify(Some(code), "denied", Some("az1"));
        assert_eq!(e, BrokerError::zone_independent(format!("{code}: denied")), "{code}");
    }
    assert!(matches!(classify(Some("InternalError"), "oops", None), BrokerError::Transient { .. }));
    assert!(matches!(classify(None, "connection refused", None), BrokerError::Transient { .. }));
}

#[test]
fn client_tokens_are_short_stable_and_distinct_per_attempt_and_model() {
    let t = "machine-12/machine-0:6f1c2a9e-0b7d-4a57-9b1e-3c2d1e0f9a8b/0";
    let a = client_token("model-a", t);
    assert!(a.len() <= 64 && a.is_ascii());
    assert_eq!(a, client_token("model-a", t));
    assert_ne!(a, client_token("model-a", "machine-12/machine-0:6f1c2a9e-0b7d-4a57-9b1e-3c2d1e0f9a8b/1"));
    // Tokens are scoped to the account: two models' equal tokens must not collide.
    assert_ne!(a, client_token("model-b", t));
}

fn instance(id: &str, state: InstanceStateName, tags: &[(&str, &str)]) -> Instance {
    Instance::builder()
        .instance_id(id)
        .state(AwsState::builder().name(state).build())
        .placement(Placement::builder().availability_zone("us-east-1b").build())
        .set_tags(Some(tags.iter().map(|(k, v)| Tag::builder().key(*k).value(*v).build()).collect()))
        .launch_time(aws_sdk_ec2::primitives::DateTime::from_secs(1_000))
        .build()
}

#[test]
fn only_instances_with_our_model_tag_are_ours() {
    let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_600);
    let ours = instance(
        "i-1",
        InstanceStateName::Stopping,
        &[(TAG_MODEL, "m-uuid"), (TAG_MACHINE, "7"), (TAG_START, "machine-0:n")],
    );
    let got = to_cloud_instance(&ours, "m-uuid", now).unwrap();
    assert_eq!(got.id.to_string(), "i-1");
    assert_eq!(got.state, InstanceState::Stopped);
    assert_eq!(got.zone.as_deref(), Some("us-east-1b"));
    assert_eq!(got.tags.machine.map(|m| m.to_string()).as_deref(), Some("7"));
    assert_eq!(got.tags.start.as_deref(), Some("machine-0:n"));
    assert_eq!(got.age, Some(Duration::from_secs(600)), "aged from LaunchTime");
    let theirs = instance("i-2", InstanceStateName::Running, &[(TAG_MODEL, "another-model"), (TAG_MACHINE, "7")]);
    assert_eq!(to_cloud_instance(&theirs, "m-uuid", now), None);
    let untagged = instance("i-3", InstanceStateName::Running, &[]);
    assert_eq!(to_cloud_instance(&untagged, "m-uuid", now), None);
}

#[test]
fn config_errors_name_what_is_missing() {
    let ok = Ec2Config {
        model_uuid: "u".into(),
        region: Some("us-east-1".into()),
        image_id: "ami-123".into(),
        instance_type: Some("t3.micro".into()),
        ..Ec2Config::default()
    };
    assert_eq!(ok.validate(), Ok(()));
    let no_image = Ec2Config { image_id: String::new(), ..ok.clone() };
    assert_eq!(
        no_image.validate().unwrap_err().to_string(),
        "EC2 broker: an image (--ec2-image AMI) is required (see `provisioner serve --help`)"
    );
    let bad_endpoint = Ec2Config { endpoint: Some("localhost:5000".into()), ..ok.clone() };
    assert!(bad_endpoint.validate().unwrap_err().to_string().contains("not an http(s) URL"));
}

#[test]
fn tags_constraints_become_instance_tags_without_touching_our_identity() {
    let got = constraint_tags(&["team=web".into(), "gpu".into(), " ".into(), format!("{TAG_MODEL}=theirs")]);
    assert_eq!(got, [("team".to_owned(), "web".to_owned()), ("juju-tag-gpu".to_owned(), "true".to_owned())]);
}

#[test]
fn root_disk_rounds_up_to_whole_gib() {
    assert_eq!(root_disk_gib(20 * 1024), 20);
    assert_eq!(root_disk_gib(10_000), 10);
    assert_eq!(root_disk_gib(1), 1);
    assert_eq!(root_disk_gib(0), 1);
}

#[test]
fn an_empty_instance_type_is_refused_and_none_is_fine() {
    let base = Ec2Config { model_uuid: "u".into(), image_id: "ami-1".into(), ..Ec2Config::default() };
    assert_eq!(base.validate(), Ok(()));
    let empty = Ec2Config { instance_type: Some(" ".into()), ..base };
    assert!(empty.validate().unwrap_err().to_string().contains("instance type"));
}

#[test]
fn shared_tags_never_override_identity_or_each_other() {
    let identity = identity_tags("m-uuid", Some(&crate::model::MachineId::new("7")), Some("machine-0:n"));
    let extra = [
        ("Name".to_owned(), "theirs".to_owned()),
        (TAG_BATCH.to_owned(), "x".to_owned()),
        ("team".to_owned(), "a".to_owned()),
    ]
    .into_iter()
    .collect();
    let c = crate::model::Constraints { tags: vec!["team=b".into(), "gpu".into()], ..Default::default() };
    let got: Vec<(String, String)> = with_shared_tags(identity, &extra, &c)
        .iter()
        .map(|t| (t.key().unwrap().to_owned(), t.value().unwrap().to_owned()))
        .collect();
    let want = [
        (TAG_MODEL, "m-uuid"),
        (TAG_MACHINE, "7"),
        ("Name", "provisioner-7"),
        (TAG_START, "machine-0:n"),
        ("team", "a"),
        ("juju-tag-gpu", "true"),
    ];
    assert_eq!(got, want.map(|(k, v)| (k.to_owned(), v.to_owned())));
}

/// A batch's machines are named at launch, in launch order, over tags of at most 256
/// characters; an instance without its own machine tag is its launch index's machine (a crash
/// between `RunInstances` and `CreateTags` leaves it so), its own tag wins once set, and a batch
/// too large to name is launched without them. Neither the model's tags nor a `tags=`
/// constraint can set a key of ours.
#[test]
fn a_batched_instance_is_its_launch_index_machine_until_tagged() {
    use super::broker::{member_tags, TAG_BATCH_MEMBERS};
    use crate::model::MachineId;
    let machines: Vec<MachineId> = (0..200).map(|i| MachineId::new(format!("{}", 1000 + i))).collect();
    let tags = member_tags(&machines).expect("200 four-digit ids fit");
    assert_eq!(tags.len(), 4, "51 ids of five characters a tag");
    assert!(tags.iter().all(|t| t.value().unwrap().len() <= 256));
    assert_eq!(tags[0].key(), Some(format!("{TAG_BATCH_MEMBERS}-0").as_str()));
    let mut all = identity_tags("m-uuid", None, None);
    all.extend(tags);
    let launched = |index: i32, own: Option<&str>| {
        let mut t = all.clone();
        if let Some(m) = own {
            t.push(Tag::builder().key(TAG_MACHINE).value(m).build());
        }
        Instance::builder()
            .instance_id(format!("i-{index}"))
            .state(AwsState::builder().name(InstanceStateName::Running).build())
            .ami_launch_index(index)
            .set_tags(Some(t))
            .build()
    };
    let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_600);
    let machine = |i: &Instance| to_cloud_instance(i, "m-uuid", now).unwrap().tags.machine;
    assert_eq!(machine(&launched(0, None)), Some(MachineId::new("1000")));
    assert_eq!(machine(&launched(52, None)), Some(MachineId::new("1052")), "across the tags' boundary");
    assert_eq!(machine(&launched(199, None)), Some(MachineId::new("1199")));
    assert_eq!(machine(&launched(200, None)), None, "no such member");
    assert_eq!(machine(&launched(3, Some("7"))), Some(MachineId::new("7")), "its own tag wins (a reuse)");
    let huge: Vec<MachineId> = (0..2000).map(|i| MachineId::new(format!("{}", 100_000 + i))).collect();
    assert!(member_tags(&huge).is_none(), "too many to name in 16 tags");
    let extra = [(format!("{TAG_BATCH_MEMBERS}-9"), "1".to_owned())].into_iter().collect();
    let c = crate::model::Constraints { tags: vec![format!("{TAG_BATCH_MEMBERS}-8=2")], ..Default::default() };
    let shared = with_shared_tags(Vec::new(), &extra, &c);
    assert!(shared.is_empty(), "no key of ours from the model or a constraint: {shared:?}");
}
