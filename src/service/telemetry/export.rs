//! OTLP over HTTP: a batch of spans encoded as an `ExportTraceServiceRequest` (protobuf, the
//! messages of `opentelemetry-proto`, no gRPC stack) and posted to the collector's traces URL
//! with ureq, within a deadline. Called on the exporting thread only (`processor`).

use std::time::Duration;

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::transform::common::tonic::ResourceAttributesWithSchema;
use opentelemetry_proto::transform::trace::tonic::group_spans_by_resource_and_scope;
use opentelemetry_sdk::error::{OTelSdkError, OTelSdkResult};
use opentelemetry_sdk::trace::{SpanData, SpanExporter};
use opentelemetry_sdk::Resource;
use prost::Message;

/// Posts batches of spans to one OTLP/HTTP traces URL.
#[derive(Debug)]
pub(super) struct OtlpHttp {
    agent: ureq::Agent,
    url: String,
    resource: ResourceAttributesWithSchema,
}

impl OtlpHttp {
    /// To `url` (the whole traces URL, `.../v1/traces`), each post within `deadline`.
    pub(super) fn new(url: &str, deadline: Duration) -> Self {
        let agent = ureq::AgentBuilder::new().timeout(deadline).build();
        Self { agent, url: url.to_owned(), resource: ResourceAttributesWithSchema::default() }
    }
}

impl SpanExporter for OtlpHttp {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let request =
            ExportTraceServiceRequest { resource_spans: group_spans_by_resource_and_scope(batch, &self.resource) };
        self.agent
            .post(&self.url)
            .set("Content-Type", "application/x-protobuf")
            .send_bytes(&request.encode_to_vec())
            .map(drop)
            .map_err(|e| OTelSdkError::InternalFailure(format!("posting spans to {}: {e}", self.url)))
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.resource = resource.into();
    }
}
