variable "project" {
  description = "The project the function runs in."
  type        = string
}

variable "region" {
  description = "The function's region (and its trigger's)."
  type        = string
}

variable "name" {
  description = "The function's name (its URL ends with it)."
  type        = string
}

variable "description" {
  description = "What the function does."
  type        = string
}

variable "entry_point" {
  description = "The Python function in functions/main.py that serves it."
  type        = string
}

variable "runtime" {
  description = "The Cloud Functions runtime."
  type        = string
  default     = "python312"
}

variable "source_bucket" {
  description = "The bucket holding the packaged source."
  type        = string
}

variable "source_object" {
  description = "The packaged source's object (named by its content hash, so a new package redeploys)."
  type        = string
}

variable "build_service_account" {
  description = "The service account Cloud Build builds the function as (projects/P/serviceAccounts/EMAIL); null: the project's default."
  type        = string
  default     = null
}

variable "service_account_email" {
  description = "The function's own identity (one per function)."
  type        = string
}

variable "memory" {
  description = "Memory per instance (e.g. \"512Mi\")."
  type        = string
  default     = "512Mi"
}

variable "cpu" {
  description = "CPUs per instance."
  type        = string
  default     = "1"
}

variable "timeout_seconds" {
  description = "How long one invocation may run."
  type        = number
  default     = 60
}

variable "min_instances" {
  description = "Instances kept warm (0: scale to zero; cold starts cost a few seconds)."
  type        = number
  default     = 0
}

variable "max_instances" {
  description = "The most instances at once."
  type        = number
  default     = 10
}

variable "concurrency" {
  description = "Requests one instance serves at once."
  type        = number
  default     = 1
}

variable "ingress" {
  description = "ALLOW_ALL, ALLOW_INTERNAL_ONLY or ALLOW_INTERNAL_AND_GCLB."
  type        = string
  default     = "ALLOW_INTERNAL_ONLY"

  validation {
    condition     = contains(["ALLOW_ALL", "ALLOW_INTERNAL_ONLY", "ALLOW_INTERNAL_AND_GCLB"], var.ingress)
    error_message = "ingress must be ALLOW_ALL, ALLOW_INTERNAL_ONLY or ALLOW_INTERNAL_AND_GCLB."
  }
}

variable "environment" {
  description = "Environment variables (see the README's \"Settings of the functions\")."
  type        = map(string)
  default     = {}
}

variable "secrets" {
  description = "Environment variables read from Secret Manager at instance start: variable => secret id (its latest version)."
  type        = map(string)
  default     = {}
}

variable "pubsub_trigger" {
  description = "For a CloudEvent function: the topic (id) whose messages trigger it through Eventarc, the account the trigger invokes it as, and whether a failed invocation is retried. Null for an HTTP function."
  type = object({
    topic                 = string
    service_account_email = string
    retry                 = bool
  })
  default = null
}

variable "more_pubsub_topics" {
  description = "Further topics (ids) whose messages trigger the function, each through an Eventarc trigger of its own named {name}-from-{key}, with pubsub_trigger's account and retry, and dead_letter's policy on its subscription."
  type        = map(string)
  default     = {}
}

variable "dead_letter" {
  description = "Where messages the function failed on max_delivery_attempts times go (with a Pub/Sub trigger only); null: retried until the subscription's retention ends. Needs gcloud where Terraform runs."
  type = object({
    topic                 = string
    max_delivery_attempts = number
    pubsub_service_agent  = string
  })
  default = null
}

variable "invokers" {
  description = "Members granted roles/run.invoker on the function's service."
  type        = list(string)
  default     = []
}

variable "labels" {
  description = "Labels on the function."
  type        = map(string)
  default     = {}
}
