terraform {
  required_version = ">= 1.6"

  required_providers {
    google = {
      source = "hashicorp/google"
      # Instance templates pass provisioning_model FLEX_START through from 7.x on; earlier
      # releases silently made STANDARD templates.
      version = ">= 7.0, < 8.0"
    }
    random = {
      source  = "hashicorp/random"
      version = ">= 3.6, < 4.0"
    }
  }
}

provider "google" {
  project = var.project
  region  = var.region
}
