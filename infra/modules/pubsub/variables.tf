variable "project" {
  description = "The project the topics live in."
  type        = string
}

variable "labels" {
  description = "Labels on every topic and subscription."
  type        = map(string)
  default     = {}
}

variable "message_retention" {
  description = "How long a topic keeps published messages, so that a new subscription can seek back (e.g. \"86400s\")."
  type        = string
  default     = "86400s"
}

variable "kms_key_name" {
  description = "A Cloud KMS key to encrypt the topics with; null: Google-managed encryption."
  type        = string
  default     = null
}

variable "tenants" {
  description = "The tenants by name: each gets capacity-requests-{tenant}, on which its publishers act as it, and capacity-events-{tenant}, the subscription of its events only, read by its subscribers."
  type = map(object({
    publishers  = list(string)
    subscribers = list(string)
  }))
  default = {}
}

variable "every_tenant_publishers" {
  description = "Members that may publish on every tenant's request topic (the ci_hook function, which publishes for the tenant a CI mapping names)."
  type        = list(string)
  default     = []
}

variable "admins" {
  description = "Members that may publish on capacity-admin-requests, whose messages act for any tenant."
  type        = list(string)
  default     = []
}

variable "shared_requests_topic" {
  description = "Make the shared capacity-requests topic, which trusts every publisher to name its tenant (small single-team installs)."
  type        = bool
  default     = false
}

variable "request_publishers" {
  description = "Members that may publish on the shared capacity-requests (with shared_requests_topic only): each may act for any tenant."
  type        = list(string)
  default     = []
}

variable "event_publishers" {
  description = "Members that publish status events on capacity-events (intake, reconcile, timer, api)."
  type        = list(string)
  default     = []
}

variable "tick_publishers" {
  description = "Members that nudge the reconciler on reconcile-ticks (intake, timer, api). Cloud Scheduler publishes as its own service agent."
  type        = list(string)
  default     = []
}

variable "event_subscribers" {
  description = "Members that may attach subscriptions to capacity-events (dashboards, `dws wait`)."
  type        = list(string)
  default     = []
}

variable "pubsub_service_agent" {
  description = "The project's Pub/Sub service agent (service-NUMBER@gcp-sa-pubsub.iam.gserviceaccount.com), which forwards dead letters."
  type        = string
}

variable "dead_letter_readers" {
  description = "Members that may pull (and so replay) dead-lettered request messages."
  type        = list(string)
  default     = []
}
