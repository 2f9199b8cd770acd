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

variable "request_publishers" {
  description = "Members that may publish request messages (submit, cancel, release) on capacity-requests: the ci_hook function, and the teams' users or CI identities."
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
