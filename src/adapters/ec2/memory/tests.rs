use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::model::instance_types::InstanceType;
use crate::model::{CapacityType, MachineId};
use crate::ports::BrokerError;

/// The first caller reads; callers during its read wait and get its value; later ones get it
/// as known. A failed read leaves the value unknown, and the next waiting caller reads.
#[test]
fn a_value_is_read_once_and_a_failed_read_is_made_again_by_the_next_caller() {
    let mut once: OnceRead<u32, &str> = OnceRead::default();
    assert!(matches!(once.ask("a"), Ask::Read("a")));
    assert!(matches!(once.ask("b"), Ask::Wait));
    assert!(matches!(once.ask("c"), Ask::Wait));
    assert!(matches!(once.read(None), After::Next(Some("b"))), "a failed read: the next caller reads");
    assert!(matches!(once.ask("d"), Ask::Wait), "still one read at a time");
    match once.read(Some(7)) {
        After::Known(7, waiting) => assert_eq!(waiting, ["c", "d"]),
        _ => panic!("the waiting callers get the value"),
    }
    assert!(matches!(once.ask("e"), Ask::Known(7, "e")));

    let mut lone: OnceRead<u32, &str> = OnceRead::default();
    assert!(matches!(lone.ask("a"), Ask::Read("a")));
    assert!(matches!(lone.read(None), After::Next(None)));
    assert!(matches!(lone.ask("b"), Ask::Read("b")), "nobody reading: the next caller reads");
}

/// The fail-over memory and the untagged instances, as the broker's calls use them.
#[test]
fn the_book_remembers_capacity_failures_ambiguous_attempts_and_untagged_instances() {
    let mut book = MemoryBook::new(Duration::from_secs(60));
    let types = [InstanceType::named("t3.large"), InstanceType::named("m5.large")];
    let now = Duration::from_secs(1);
    let az1 = Place { zone: Some("az1"), capacity: CapacityType::OnDemand };
    let order = book.order(now, az1, "0/n/1", &types);
    assert_eq!(order[0].instance_type, "t3.large");
    book.attempted(now, az1, "0/n/1", Attempted::OutOfCapacity("t3.large".into()));
    assert!(book.is_remembered(now, "t3.large", az1));
    let spot = Place { capacity: CapacityType::Spot, ..az1 };
    assert!(!book.is_remembered(now, "t3.large", spot), "spot capacity is remembered apart");
    book.attempted(now, spot, "2/n/1", Attempted::OutOfCapacity("m5.large".into()));
    assert!(book.is_remembered(now, "m5.large", spot));
    assert!(!book.is_remembered(now, "m5.large", az1), "and on-demand apart from spot");
    book.attempted(now, az1, "0/n/1", Attempted::Ambiguous("m5.large".into()));
    let again = book.order(now, az1, "0/n/1", &types);
    assert_eq!(again[0].instance_type, "m5.large", "the ambiguous attempt first, the failed type last");
    assert_eq!(again[0].client_token, "0/n/1/m5.large");
    book.attempted(now, az1, "0/n/1", Attempted::Settled);
    let other = book.order(now, Place { zone: Some("az2"), ..az1 }, "1/n/1", &types);
    assert_eq!(other[0].instance_type, "t3.large", "another zone is not remembered");

    let key = (MachineId::new("0"), "n".to_owned());
    assert!(book.take_untagged(&key).is_none());
    book.remember_untagged(key.clone(), ("i-1".into(), Vec::new()));
    assert_eq!(book.take_untagged(&key).map(|(id, _)| id).as_deref(), Some("i-1"));
    assert!(book.take_untagged(&key).is_none(), "taken once");
    assert!(book.pacer().is_none());
}

/// Concurrent callers of the catalogue make one read (the others wait for it); a failed read
/// is answered to its caller only, and the next caller reads again.
#[actix_rt::test]
async fn concurrent_catalogue_reads_make_one_call() {
    let memory = BrokerMemory::start(Duration::ZERO);
    let reads = Arc::new(AtomicUsize::new(0));
    let read = |fail: bool| {
        let reads = reads.clone();
        ReadCatalogue {
            read: Box::pin(async move {
                reads.fetch_add(1, Ordering::SeqCst);
                actix_rt::time::sleep(Duration::from_millis(20)).await;
                match fail {
                    true => Err(BrokerError::transient("no catalogue")),
                    false => Ok(Arc::new(vec![InstanceType::named("t3.micro")])),
                }
            }),
        }
    };
    let failed = memory.send(read(true)).await.unwrap();
    assert!(failed.is_err());
    let all = futures::future::join_all((0..5).map(|_| memory.send(read(false)))).await;
    assert!(all.iter().all(|r| matches!(r, Ok(Ok(c)) if c.len() == 1)), "{all:?}");
    assert_eq!(reads.load(Ordering::SeqCst), 2, "the failed read, then one for five callers");
    let known = memory.send(read(false)).await.unwrap().unwrap();
    assert_eq!(known.len(), 1);
    assert_eq!(reads.load(Ordering::SeqCst), 2, "known: not read again");

    let root = memory.send(ReadRootDevice { read: Box::pin(async { None }) }).await.unwrap();
    assert_eq!(root, None);
    let root = memory.send(ReadRootDevice { read: Box::pin(async { Some("/dev/xvda".into()) }) }).await.unwrap();
    assert_eq!(root.as_deref(), Some("/dev/xvda"));
    let root = memory.send(ReadRootDevice { read: Box::pin(async { None }) }).await.unwrap();
    assert_eq!(root.as_deref(), Some("/dev/xvda"), "known once read");
}
