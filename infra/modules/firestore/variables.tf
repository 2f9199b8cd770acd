variable "project" {
  description = "The project the database lives in."
  type        = string
}

variable "location" {
  description = "The database's location: a region (us-central1) or a multi-region (nam5, eur3)."
  type        = string
}

variable "deletion_protection" {
  description = "Refuse to delete the database (and abandon it on terraform destroy)."
  type        = bool
  default     = true
}
