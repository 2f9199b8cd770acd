variable "project" {
  description = "The project the job lives in."
  type        = string
}

variable "region" {
  description = "The job's region."
  type        = string
}

variable "name" {
  description = "The job's name."
  type        = string
  default     = "opendws-reconcile-tick"
}

variable "schedule" {
  description = "When to tick (cron)."
  type        = string
  default     = "* * * * *"
}

variable "time_zone" {
  description = "The schedule's time zone."
  type        = string
  default     = "Etc/UTC"
}

variable "topic_id" {
  description = "The reconcile-ticks topic (projects/P/topics/reconcile-ticks)."
  type        = string
}
