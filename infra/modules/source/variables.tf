variable "project" {
  description = "The project the bucket lives in."
  type        = string
}

variable "bucket_name" {
  description = "The source bucket's (globally unique) name."
  type        = string
}

variable "location" {
  description = "The bucket's location (the functions' region)."
  type        = string
}

variable "archive" {
  description = "The packaged source (`make -C infra package` writes infra/build/opendws-functions.zip)."
  type        = string
}

variable "access_log_bucket" {
  description = "A bucket for the source bucket's access logs; null: none."
  type        = string
  default     = null
}

variable "labels" {
  description = "Labels on the bucket."
  type        = map(string)
  default     = {}
}
