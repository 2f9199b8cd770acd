variable "project" {
  description = "The project the load balancer and the api are in."
  type        = string
}

variable "project_number" {
  description = "The project's number (the IAP audience names it)."
  type        = string
}

variable "region" {
  description = "The api function's region."
  type        = string
}

variable "name" {
  description = "The prefix of the load balancer's resources (the api function's name)."
  type        = string
}

variable "service_name" {
  description = "The api function's Cloud Run service (the function's name)."
  type        = string
}

variable "domain" {
  description = "The domain users open the api at through IAP; its DNS A record must point at the address output for the managed certificate to be issued."
  type        = string
}

variable "members" {
  description = "Who may pass IAP (user:, group:, serviceAccount:, domain: members), granted roles/iap.httpsResourceAccessor on the backend service."
  type        = list(string)
}

variable "labels" {
  description = "Labels on the forwarding rule."
  type        = map(string)
  default     = {}
}
