variable "project" {
  description = "The project whose Cloud Monitoring gets the dashboard and the alert policies."
  type        = string
}

variable "metric_prefix" {
  description = "Where OpenTelemetry's Cloud Monitoring exporter writes opendws's metrics (its default prefix)."
  type        = string
  default     = "workload.googleapis.com"
}

variable "wait_threshold_seconds" {
  description = "Alert when a pending request has waited longer than this (opendws_pending_longest_wait_seconds)."
  type        = number
  default     = 86400
}

variable "reconcile_silence_seconds" {
  description = "Alert when no reconcile pass has been recorded for this long (opendws_reconcile_passes_total absent); the tick runs every minute."
  type        = number
  default     = 600
}

variable "notification_channels" {
  description = "Notification channel ids (projects/P/notificationChannels/N) the two alert policies notify; empty: the incidents are only shown in the console."
  type        = list(string)
  default     = []
}
