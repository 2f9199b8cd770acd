variable "project" {
  description = "The project the pools' VMs run in."
  type        = string
}

variable "boot_image" {
  description = "The VMs' default boot image (a Deep Learning VM GPU family: the NVIDIA driver, Docker with the NVIDIA Container Toolkit, python3)."
  type        = string
  default     = "projects/deeplearning-platform-release/global/images/family/common-cu129-ubuntu-2204-nvidia-580"
}

variable "default_service_account" {
  description = "The job VMs' account (email) for a pool that names none of its own; null: Compute Engine's default."
  type        = string
  default     = null
}

variable "flex_pools" {
  description = <<-EOT
    Flex-start templates to make ahead, one per machine type, saying how its VMs look. Machine
    types not listed here get a template made by the reconciler on first use, with the function
    settings' image and network. The scheduler's view of the pools (zones, capacity,
    accelerator, tenants) is the configuration that `dws config apply` writes.
  EOT
  type = list(object({
    shape           = string
    boot_image      = optional(string)
    disk_size_gb    = optional(number, 200)
    network         = optional(string, "global/networks/default")
    subnetwork      = optional(string)
    service_account = optional(string)
    secure_boot     = optional(bool, false)
    accelerator = optional(object({
      type  = string
      count = number
    }))
  }))
  default = []

  validation {
    condition     = length(distinct([for pool in var.flex_pools : pool.shape])) == length(var.flex_pools)
    error_message = "Each machine type (shape) is listed once."
  }
}

variable "labels" {
  description = "Labels on the VMs."
  type        = map(string)
  default     = {}
}
