//! Spot interruption warnings and rebalance recommendations (issue 33), read as Karpenter reads
//! them: EC2 sends them to EventBridge, a rule delivers them to an SQS queue, the broker long-polls
//! the queue ([`InterruptionQueue::receive`]) and deletes each message once the provisioner has
//! acted on it ([`InterruptionQueue::acknowledge`]): a message not deleted comes back after the
//! queue's visibility timeout, so a notice is never lost to a crash between reading and acting.
//!
//! Which events count ([`parse_event`]): "EC2 Spot Instance Interruption Warning" (the instance
//! goes two minutes after the event's `time`), "EC2 Instance Rebalance Recommendation" (it is at
//! an elevated risk of interruption) and "EC2 Instance State-change Notification" to
//! `shutting-down`/`terminated` (it is going, warned or not). Anything else on the queue is
//! acknowledged and ignored.
//!
//! With a queue configured (`interruption_queue`, `--ec2-interruption-queue`) the EC2 broker
//! answers the port's calls from it: [`crate::ports::Broker::supports_interruptions`] is true,
//! `interruption_notices` is one [`InterruptionQueue::receive`], each [`Notice`] handed on as a
//! [`crate::ports::InterruptionNotice`] ([`Notice::to_port`]: its deadline is
//! [`Notice::deadline`] less the wall clock's now, saturating at zero), and `acknowledge_notices`
//! deletes by receipt ([`InterruptionQueue::acknowledge`]). Without one, the port's defaults.

use std::time::{Duration, SystemTime};

use aws_sdk_sqs::Client;
use serde_json::Value;

use crate::model::InstanceId;
use crate::ports::{BrokerError, InterruptionNotice};

/// How long EC2 gives between a spot interruption warning and the interruption.
pub const INTERRUPTION_NOTICE: Duration = Duration::from_secs(120);

/// The longest one receive waits for a message (SQS's long-poll maximum).
pub const MAX_WAIT: Duration = Duration::from_secs(20);

/// What a notice says about an instance: the port's kinds, one for one.
pub use crate::ports::NoticeKind;

/// One notice from the queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Notice {
    /// The instance it is about.
    pub instance: InstanceId,
    /// What it says.
    pub kind: NoticeKind,
    /// When EC2 sent it (the event's `time`), if it said.
    pub sent: Option<SystemTime>,
    /// The queue's receipt, to acknowledge it with once acted on.
    pub receipt: String,
}

impl Notice {
    /// When the instance is taken away: two minutes after an interruption warning was sent;
    /// `None` for other notices, or when the warning's time is unknown.
    pub fn deadline(&self) -> Option<SystemTime> {
        (self.kind == NoticeKind::Interruption).then_some(self.sent?).map(|t| t + INTERRUPTION_NOTICE)
    }

    /// How long from `now` (the wall clock) until [`Notice::deadline`], zero once it has passed;
    /// `None` when the notice has no deadline.
    pub fn remaining(&self, now: SystemTime) -> Option<Duration> {
        self.deadline().map(|d| d.duration_since(now).unwrap_or(Duration::ZERO))
    }

    /// The notice as the port hands it to the provisioner, its deadline counted from `now`.
    pub fn to_port(&self, now: SystemTime) -> InterruptionNotice {
        InterruptionNotice {
            instance: self.instance.clone(),
            kind: self.kind,
            deadline: self.remaining(now),
            receipt: self.receipt.clone(),
        }
    }
}

/// The instance and what the EventBridge event `body` (an SQS message's body) says of it, with
/// the event's time; `None` for an event that is not about an instance's interruption.
pub fn parse_event(body: &str) -> Option<(InstanceId, NoticeKind, Option<SystemTime>)> {
    let event: Value = serde_json::from_str(body).ok()?;
    let detail = event.get("detail")?;
    let instance = detail.get("instance-id")?.as_str()?;
    let kind = match event.get("detail-type")?.as_str()? {
        "EC2 Spot Instance Interruption Warning" => NoticeKind::Interruption,
        "EC2 Instance Rebalance Recommendation" => NoticeKind::Rebalance,
        "EC2 Instance State-change Notification" => match detail.get("state")?.as_str()? {
            "shutting-down" | "terminated" => NoticeKind::Terminating,
            _ => return None,
        },
        _ => return None,
    };
    let sent = event.get("time").and_then(Value::as_str).and_then(|t| humantime::parse_rfc3339_weak(t).ok());
    Some((InstanceId::new(instance), kind, sent))
}

/// The queue the notices arrive on.
#[derive(Clone, Debug)]
pub struct InterruptionQueue {
    client: Client,
    url: String,
    wait: Duration,
}

impl InterruptionQueue {
    /// The queue at `url`, read with `client` (the broker's AWS configuration), each receive
    /// waiting at most `wait` (capped at [`MAX_WAIT`]).
    pub fn new(client: Client, url: impl Into<String>, wait: Duration) -> Self {
        Self { client, url: url.into(), wait: wait.min(MAX_WAIT) }
    }

    /// The same queue, each receive waiting at most `wait` (capped at [`MAX_WAIT`]).
    pub fn with_wait(&self, wait: Duration) -> Self {
        Self { wait: wait.min(MAX_WAIT), ..self.clone() }
    }

    /// The queue's URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The notices that arrive within the wait (at most ten). Messages that are no notice of
    /// ours are acknowledged at once (deleted) and not answered.
    pub async fn receive(&self) -> Result<Vec<Notice>, BrokerError> {
        let secs = i32::try_from(self.wait.as_secs()).unwrap_or(20);
        let out = self
            .client
            .receive_message()
            .queue_url(&self.url)
            .max_number_of_messages(10)
            .wait_time_seconds(secs)
            .send()
            .await
            .map_err(|e| queue_error("ReceiveMessage", e))?;
        let mut notices = Vec::new();
        let mut ignored = Vec::new();
        for m in out.messages() {
            let Some(receipt) = m.receipt_handle() else { continue };
            match m.body().and_then(parse_event) {
                Some((instance, kind, sent)) => {
                    notices.push(Notice { instance, kind, sent, receipt: receipt.to_owned() })
                }
                None => ignored.push(receipt.to_owned()),
            }
        }
        if !ignored.is_empty() {
            tracing::debug!(messages = ignored.len(), "deleting messages on the interruption queue that are no notice");
            self.acknowledge(ignored).await?;
        }
        Ok(notices)
    }

    /// Deletes the messages of these receipts: their notices were acted on.
    pub async fn acknowledge(&self, receipts: Vec<String>) -> Result<(), BrokerError> {
        for chunk in receipts.chunks(10) {
            let mut batch = self.client.delete_message_batch().queue_url(&self.url);
            for (i, receipt) in chunk.iter().enumerate() {
                let entry = aws_sdk_sqs::types::DeleteMessageBatchRequestEntry::builder()
                    .id(i.to_string())
                    .receipt_handle(receipt)
                    .build()
                    .map_err(|e| BrokerError::zone_independent(format!("SQS DeleteMessageBatch: {e}")))?;
                batch = batch.entries(entry);
            }
            let out = batch.send().await.map_err(|e| queue_error("DeleteMessageBatch", e))?;
            if let Some(failed) = out.failed().first() {
                return Err(BrokerError::transient(format!(
                    "SQS DeleteMessageBatch: {} message(s) not deleted: {}",
                    out.failed().len(),
                    failed.message().unwrap_or(failed.code())
                )));
            }
        }
        Ok(())
    }
}

/// An SQS call's failure: throttling is throttled, no answer or a service fault transient,
/// anything else (no such queue, access denied) zone-independent, with SQS's code and message.
fn queue_error<E, R>(call: &str, e: aws_sdk_sqs::error::SdkError<E, R>) -> BrokerError
where
    E: aws_sdk_sqs::error::ProvideErrorMetadata + std::error::Error + 'static,
    R: std::fmt::Debug,
{
    use aws_sdk_sqs::error::ProvideErrorMetadata;
    let code = e.code().map(str::to_owned);
    let message = format!("SQS {call}: {}", aws_sdk_sqs::error::DisplayErrorContext(&e));
    match code.as_deref() {
        None => BrokerError::transient(message),
        Some(c) if c.contains("Throttl") || c == "RequestThrottled" => BrokerError::throttled(message),
        Some("InternalError" | "ServiceUnavailable" | "InternalFailure") => BrokerError::transient(message),
        Some(_) => BrokerError::zone_independent(message),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(detail_type: &str, detail: &str) -> String {
        format!(
            r#"{{"version":"0","id":"x","detail-type":"{detail_type}","source":"aws.ec2","time":"2026-12-06T10:00:14Z","region":"us-east-1","resources":[],"detail":{detail}}}"#
        )
    }

    #[test]
    fn eventbridge_events_read_as_notices_and_others_are_none() {
        let warning =
            event("EC2 Spot Instance Interruption Warning", r#"{"instance-id":"i-1","instance-action":"terminate"}"#);
        let (id, kind, sent) = parse_event(&warning).unwrap();
        assert_eq!((id.as_str(), kind), ("i-1", NoticeKind::Interruption));
        let sent = sent.unwrap();
        let notice = Notice { instance: id, kind, sent: Some(sent), receipt: "r".into() };
        assert_eq!(notice.deadline(), Some(sent + Duration::from_secs(120)));
        let rebalance = event("EC2 Instance Rebalance Recommendation", r#"{"instance-id":"i-2"}"#);
        assert_eq!(parse_event(&rebalance).unwrap().1, NoticeKind::Rebalance);
        let gone = event("EC2 Instance State-change Notification", r#"{"instance-id":"i-3","state":"terminated"}"#);
        assert_eq!(parse_event(&gone).unwrap().1, NoticeKind::Terminating);
        let running = event("EC2 Instance State-change Notification", r#"{"instance-id":"i-3","state":"running"}"#);
        assert!(parse_event(&running).is_none());
        assert!(parse_event(&event("AWS Health Event", r#"{"instance-id":"i-4"}"#)).is_none());
        assert!(parse_event("not json").is_none());
    }

    #[test]
    fn a_notice_reaches_the_port_with_its_deadline_counted_from_now_saturating() {
        let sent = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000);
        let warning = Notice {
            instance: InstanceId::new("i-1"),
            kind: NoticeKind::Interruption,
            sent: Some(sent),
            receipt: "r".into(),
        };
        let port = warning.to_port(sent + Duration::from_secs(20));
        assert_eq!(
            port,
            InterruptionNotice {
                instance: InstanceId::new("i-1"),
                kind: crate::ports::NoticeKind::Interruption,
                deadline: Some(Duration::from_secs(100)),
                receipt: "r".into(),
            }
        );
        assert_eq!(warning.to_port(sent + Duration::from_secs(500)).deadline, Some(Duration::ZERO), "passed: zero");
        let unknown_time = Notice { sent: None, ..warning.clone() };
        assert_eq!(unknown_time.to_port(sent).deadline, None);
        let rebalance = Notice { kind: NoticeKind::Rebalance, ..warning };
        assert_eq!(rebalance.to_port(sent).deadline, None);
    }
}
