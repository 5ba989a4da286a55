//! Cloud limits shared by the models on one account: a cloud's request buckets are per
//! account and region (EC2's), not per model, so the models that call the cloud with the same
//! credentials and region share one client-side limiter (its learned rate included), and
//! models on different accounts do not slow each other. The key: `ec2:REGION@ENDPOINT` (one
//! service has one set of credentials, the standard AWS chain's), or `sim:ACCOUNT` for the
//! simulated cloud (`model add --account`, default `default`), whose accounts also enforce
//! their bucket (`--sim-account-start-rate`; without it the simulated cloud never throttles
//! and no limiter paces it).
//!
//! [`Accounts`] is the actor that owns the accounts in use (each one's limiter is the engine's
//! limiter actor, [`SharedLimiter`]); a model's start asks it for its account
//! ([`GetAccount`]), started on first use.

use std::collections::BTreeMap;

use actix::{Actor, Context, Handler, Message, MessageResult};

use crate::config::rate_limits::{BucketLimit, RateLimits};
use crate::service::cloud::sim::SimAccount;
use crate::service::settings::{BrokerKind, ServeSettings};
use crate::SharedLimiter;

/// One account as the service knows it: the limiter its models share and, on the simulated
/// cloud, the bucket the account enforces.
#[derive(Clone)]
pub(crate) struct Account {
    /// The client-side limiter every model on the account paces its calls with.
    pub limiter: SharedLimiter,
    /// The simulated account's own bucket (sim only).
    pub sim: Option<SimAccount>,
}

/// Which account a model's calls count against, and the limits its limiter has: `None` when
/// nothing limits it (the simulated cloud without `--sim-account-start-rate`). `opts` are the
/// model's settings (`host::model_settings`), `account` the simulated account it names
/// (`None`: `default`).
pub(crate) fn account_of(opts: &ServeSettings, account: Option<&str>) -> Option<(String, RateLimits, Option<u32>)> {
    match opts.broker() {
        BrokerKind::Sim => {
            let rate = opts.sim.account_start_rate?;
            let name = account.unwrap_or("default");
            let limits = RateLimits { start: Some(BucketLimit::new(rate, f64::from(rate))), ..RateLimits::unlimited() };
            Some((format!("sim:{name}"), limits, Some(rate)))
        }
        BrokerKind::Ec2 => {
            let region = opts.ec2.region.clone().unwrap_or_default();
            let endpoint = opts.ec2.endpoint.clone().unwrap_or_default();
            Some((format!("ec2:{region}@{endpoint}"), RateLimits::ec2(), None))
        }
        // An LXD daemon has no request buckets to share.
        BrokerKind::Lxd => None,
    }
}

/// The accounts in use, by key: the actor that owns them. An account lives as long as the
/// service.
#[derive(Default)]
pub(crate) struct Accounts {
    by_key: BTreeMap<String, Account>,
}

impl Actor for Accounts {
    type Context = Context<Self>;
}

/// The account of `key`, started on first use (its limiter with `limits`, the simulated
/// bucket at `sim_rate` starts per second).
#[derive(Message)]
#[rtype(result = "Account")]
pub(crate) struct GetAccount {
    /// The account's key ([`account_of`]).
    pub key: String,
    /// Its limiter's limits.
    pub limits: RateLimits,
    /// The simulated account's rate, starts per second (sim only).
    pub sim_rate: Option<u32>,
}

impl Handler<GetAccount> for Accounts {
    type Result = MessageResult<GetAccount>;

    fn handle(&mut self, msg: GetAccount, _: &mut Context<Self>) -> Self::Result {
        let GetAccount { key, limits, sim_rate } = msg;
        let account = self.by_key.entry(key).or_insert_with_key(|key| Account {
            // The account's bucket first: it is full no later than the limiter's.
            sim: sim_rate.map(|r| SimAccount::new(key.trim_start_matches("sim:"), r)),
            limiter: SharedLimiter::start(limits),
        });
        MessageResult(account.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn models_on_one_account_and_region_share_a_key_and_others_do_not() {
        let mut opts = ServeSettings::default();
        assert!(account_of(&opts, None).is_none(), "an unthrottled simulated cloud");
        opts.sim.account_start_rate = Some(4);
        let key = |account: Option<&str>| account_of(&opts, account).unwrap().0;
        assert_eq!(key(None), "sim:default");
        assert_eq!(key(Some("default")), key(None));
        assert_ne!(key(Some("other")), key(None));
        let (_, limits, rate) = account_of(&opts, None).unwrap();
        assert_eq!((limits.start, limits.stop, rate), (Some(BucketLimit::new(4, 4.0)), None, Some(4)));
        opts.broker = Some(BrokerKind::Ec2);
        opts.ec2.region = Some("eu-west-1".into());
        let a = account_of(&opts, None).unwrap().0;
        opts.ec2.region = Some("us-east-1".into());
        let b = account_of(&opts, None).unwrap().0;
        assert_eq!(a, "ec2:eu-west-1@");
        assert_ne!(a, b, "another region is another bucket");
    }

    #[actix_rt::test]
    async fn one_key_is_one_account() {
        let accounts = Accounts::default().start();
        let get = |key: &str| GetAccount { key: key.to_owned(), limits: RateLimits::unlimited(), sim_rate: Some(2) };
        let a = accounts.send(get("sim:a")).await.unwrap();
        let again = accounts.send(get("sim:a")).await.unwrap();
        let b = accounts.send(get("sim:b")).await.unwrap();
        assert_eq!(a.sim, again.sim, "the same bucket");
        assert_ne!(a.sim, b.sim, "another account's");
    }
}
