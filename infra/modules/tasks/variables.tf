variable "project" {
  description = "The project the queue lives in."
  type        = string
}

variable "region" {
  description = "The queue's location (OPENDWS_TASKS_LOCATION)."
  type        = string
}

variable "name" {
  description = "The queue's name (OPENDWS_TASKS_QUEUE)."
  type        = string
  default     = "opendws-timers"
}

variable "max_dispatches_per_second" {
  description = "The most timers dispatched per second (many runs ending at the same minute are spread out)."
  type        = number
  default     = 50
}

variable "max_concurrent_dispatches" {
  description = "The most timer calls in flight at once."
  type        = number
  default     = 50
}

variable "max_attempts" {
  description = "Attempts per timer (-1: unlimited within max_retry_duration)."
  type        = number
  default     = 100
}

variable "max_retry_duration" {
  description = "How long a failing timer is retried."
  type        = string
  default     = "86400s"
}

variable "log_sampling_ratio" {
  description = "The share of dispatches logged (0 to 1)."
  type        = number
  default     = 1.0
}

variable "timer_setters" {
  description = "Members that arm and disarm timers (intake, reconcile, timer, api)."
  type        = list(string)
  default     = []
}

variable "timer_deleters" {
  description = "Members that only disarm timers (the agent function, which ends runs but arms none): they may delete tasks, not create them or act as the invoker."
  type        = list(string)
  default     = []
}

variable "invoker_account_name" {
  description = "The timers' invoker account (projects/P/serviceAccounts/EMAIL), whose OIDC token each task carries."
  type        = string
}
