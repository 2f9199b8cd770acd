terraform {
  required_version = ">= 1.6"

  required_providers {
    google = {
      source = "hashicorp/google"
      # 7.41.0 (July 17, 2026) is the first release whose google_compute_instance_template
      # keeps provisioning_model = "FLEX_START" (CHANGELOG: "added FLEX_START and
      # RESERVATION_BOUND support to google_compute_instance, google_compute_instance_template,
      # and google_compute_region_instance_template", #28365 = magic-modules#17417; before it
      # the template was silently made STANDARD: terraform-provider-google#24172). The other
      # fields set here (max_run_duration, instance_termination_action, reservation_affinity,
      # nic_type GVNIC, hyperdisk-balanced disks) are older. infra/ makes no
      # google_compute_resize_request or google_compute_future_reservation: the reconciler
      # makes resize requests and calendar blocks through the Compute API.
      version = ">= 7.41.0, < 8.0"
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
