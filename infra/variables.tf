variable "project" {
  description = "The Google Cloud project to deploy opendws into."
  type        = string
}

variable "region" {
  description = "The region of the functions, the timer queue, the tick and the source bucket."
  type        = string
  default     = "us-central1"
}

variable "firestore_location" {
  description = "The Firestore database's location: a region or a multi-region (nam5, eur3)."
  type        = string
  default     = "nam5"
}

variable "labels" {
  description = "Labels on every labelled resource."
  type        = map(string)
  default     = { app = "opendws" }
}

variable "enable_apis" {
  description = "Enable the Google APIs opendws uses (turn off where a platform team does this)."
  type        = bool
  default     = true
}

variable "deletion_protection" {
  description = "Protect the Firestore database from deletion (and leave it behind on destroy)."
  type        = bool
  default     = true
}

variable "source_archive" {
  description = "The packaged functions (null: infra/build/opendws-functions.zip, which `make -C infra package` writes)."
  type        = string
  default     = null
}

variable "runtime" {
  description = "The functions' Python runtime."
  type        = string
  default     = "python312"
}

variable "build_service_account" {
  description = "An existing account for Cloud Build to build the functions as (projects/P/serviceAccounts/EMAIL), holding what a build needs (functions/docs/securing/build-custom-sa); null: Terraform makes opendws-build with roles/logging.logWriter, roles/artifactregistry.writer and roles/storage.objectAdmin."
  type        = string
  default     = null

  validation {
    condition     = var.build_service_account == null ? true : can(regex("^projects/[^/]+/serviceAccounts/[^/@]+@[^/]+$", var.build_service_account))
    error_message = "build_service_account is a service account's full name, projects/PROJECT/serviceAccounts/EMAIL, as a function's build_config.service_account takes it."
  }
}

variable "schedule" {
  description = "When the reconcile tick fires (cron, in schedule_time_zone). Nudges start passes between ticks."
  type        = string
  default     = "* * * * *"
}

variable "schedule_time_zone" {
  description = "The tick schedule's time zone."
  type        = string
  default     = "Etc/UTC"
}

variable "reconcile_follow_up_seconds" {
  description = "How long one reconcile invocation keeps passing (every 2 s) while requests are provisioning (OPENDWS_RECONCILE_FOLLOW_UP_SECONDS)."
  type        = number
  default     = 20
}

variable "reconcile_timeout_seconds" {
  description = "The reconcile function's timeout: a full pass plus the follow-up must fit in it."
  type        = number
  default     = 120
}

variable "max_instances" {
  description = "The most instances of each function (the reconciler's lease makes extra reconcile instances wait their turn)."
  type = object({
    intake    = optional(number, 20)
    reconcile = optional(number, 2)
    timer     = optional(number, 10)
    ci_hook   = optional(number, 10)
    api       = optional(number, 10)
    agent     = optional(number, 10)
  })
  default = {}
}

variable "min_instances" {
  description = "Instances kept warm per function (0 scales to zero; a cold start costs a few seconds of latency)."
  type = object({
    intake    = optional(number, 0)
    reconcile = optional(number, 0)
    timer     = optional(number, 0)
    ci_hook   = optional(number, 0)
    api       = optional(number, 0)
    agent     = optional(number, 0)
  })
  default = {}
}

variable "timer_queue" {
  description = "The Cloud Tasks queue of the timers: its name and dispatch limits."
  type = object({
    name                      = optional(string, "opendws-timers")
    max_dispatches_per_second = optional(number, 50)
    max_concurrent_dispatches = optional(number, 50)
  })
  default = {}
}

variable "dead_letter_max_delivery_attempts" {
  description = "Deliveries of a request message intake failed on before it goes to capacity-requests-dead-letter (5 to 100); null: no dead-letter policy (and no gcloud needed at apply)."
  type        = number
  default     = 10

  validation {
    condition     = var.dead_letter_max_delivery_attempts == null ? true : (var.dead_letter_max_delivery_attempts >= 5 && var.dead_letter_max_delivery_attempts <= 100)
    error_message = "Pub/Sub allows 5 to 100 delivery attempts."
  }
}

variable "tenants" {
  description = "The tenants (teams) by name. Each gets the request topic capacity-requests-{tenant}, on which its publishers (user:, group:, serviceAccount:) act as it — submit, cancel and release its requests, and no one else's — and the subscription capacity-events-{tenant}, which delivers its events only, to its subscribers. Name them as in the scheduler's configuration (dws config apply)."
  type = map(object({
    publishers  = optional(list(string), [])
    subscribers = optional(list(string), [])
  }))
  default = {}

  validation {
    condition     = alltrue([for tenant in keys(var.tenants) : can(regex("^[a-z0-9]([a-z0-9-]{0,38}[a-z0-9])?$", tenant))])
    error_message = "A tenant's name is 1 to 40 lowercase letters, digits and dashes, starting and ending with a letter or digit (capacity-requests-{tenant} and the Eventarc trigger opendws-intake-from-{tenant} must fit Google's name limits)."
  }

  validation {
    condition     = !contains(keys(var.tenants), "admin") && !contains(keys(var.tenants), "shared")
    error_message = "admin and shared are not tenants: admins publish on capacity-admin-requests (var.admins), and shared names the shared topic's trigger (var.shared_requests_topic)."
  }

  validation {
    condition = alltrue(flatten([
      for spec in values(var.tenants) : [
        for member in concat(spec.publishers, spec.subscribers) : !contains(["allUsers", "allAuthenticatedUsers"], member)
      ]
    ]))
    error_message = "allUsers and allAuthenticatedUsers are nobody's tenant: a tenant's publishers and subscribers are its own principals."
  }
}

variable "admins" {
  description = "Members that may publish on capacity-admin-requests, whose messages act for any tenant (as the API's admin key does)."
  type        = list(string)
  default     = []

  validation {
    condition     = !contains(var.admins, "allUsers") && !contains(var.admins, "allAuthenticatedUsers")
    error_message = "allUsers and allAuthenticatedUsers cannot be admins."
  }
}

variable "shared_requests_topic" {
  description = "Make the shared capacity-requests topic, on which every publisher (request_publishers) is trusted to name its own tenant: for small single-team installs only. Off: the topic is not made, and intake refuses anything that arrives as if on it."
  type        = bool
  default     = false
}

variable "request_publishers" {
  description = "Members that may publish on the shared capacity-requests (only with shared_requests_topic = true). Each may act for any tenant: submit against any tenant's quota, cancel or release any tenant's requests."
  type        = list(string)
  default     = []
}

variable "event_subscribers" {
  description = "Operators: members that may attach subscriptions to the unfiltered capacity-events topic, and so see every tenant's events. A tenant's own readers are its subscribers in tenants."
  type        = list(string)
  default     = []
}

variable "operators" {
  description = "Members that may read and replay dead-lettered request messages."
  type        = list(string)
  default     = []
}

variable "api_tenants" {
  description = "Tenants that get a key for the HTTP API (an admin key is always made). A tenant in tenants gets a key only if it is listed here too."
  type        = list(string)
  default     = []

  validation {
    condition     = !contains(var.api_tenants, "admin")
    error_message = "The admin key is always made: admin is not an API tenant."
  }
}

variable "api_iap" {
  description = "Identity-Aware Proxy in front of the api (null, the default: none). domain: where users open the api through IAP (a global external Application Load Balancer with a Google-managed certificate; point its DNS A record at the api_iap.address output); members: who may pass IAP (user:, group:, serviceAccount:, domain:), each then mapped to a tenant by the configuration's access table; direct_url: keep the function's own URL open for API keys and workloads' ID tokens (false: only the load balancer reaches the api, and every caller signs in through IAP)."
  type = object({
    domain     = string
    members    = list(string)
    direct_url = optional(bool, true)
  })
  default = null

  validation {
    condition     = var.api_iap == null ? true : can(regex("^([a-z0-9]([a-z0-9-]*[a-z0-9])?\\.)+[a-z]{2,}$", var.api_iap.domain))
    error_message = "api_iap.domain must be a DNS name such as opendws.example.com (the managed certificate is issued for it)."
  }

  validation {
    condition     = var.api_iap == null ? true : length(var.api_iap.members) > 0 && alltrue([for m in var.api_iap.members : can(regex("^(user|group|serviceAccount|domain):.+$", m))])
    error_message = "api_iap.members must name at least one IAM member: user:EMAIL, group:EMAIL, serviceAccount:EMAIL or domain:DOMAIN."
  }
}

variable "tenant_secret_prefixes" {
  description = "Each tenant's secret_prefix, as the scheduler's configuration gives it (projects/PROJECT/secrets/ID_PREFIX, e.g. projects/my-ml-project/secrets/vision-): the agent function reads the secrets whose names start so, and no others (roles/secretmanager.secretAccessor on PROJECT with an IAM condition on the secret's name). A tenant left out may use no secrets in its runs."
  type        = map(string)
  default     = {}

  validation {
    condition     = alltrue([for prefix in values(var.tenant_secret_prefixes) : can(regex("^projects/([a-z][a-z0-9-]{4,28}[a-z0-9]|[1-9][0-9]*)/secrets/[A-Za-z0-9_-]{0,254}$", prefix))])
    error_message = "A tenant's secret prefix is projects/PROJECT/secrets/ followed by the start of the secrets' ids, if any (e.g. projects/my-ml-project/secrets/vision-), as its secret_prefix in the scheduler's configuration."
  }
}

variable "ci_secrets" {
  description = "The Secret Manager secrets the scheduler's CI mappings name: a GitHub App's private key (ci[i].github.private_key_secret) and a GitLab token (ci[i].gitlab.token_secret), each given as projects/PROJECT/secrets/SECRET (the mapping's version name without /versions/VERSION). The agent function, which mints the CI runners, reads exactly these (roles/secretmanager.secretAccessor on each secret); the ci_hook function reads none of them. [] (the default): no CI mapping names a secret."
  type        = list(string)
  default     = []

  validation {
    condition     = alltrue([for name in var.ci_secrets : can(regex("^projects/([a-z][a-z0-9-]{4,28}[a-z0-9]|[1-9][0-9]*)/secrets/[A-Za-z0-9_-]{1,255}$", name))])
    error_message = "A CI secret is projects/PROJECT/secrets/SECRET: the secret a CI mapping's private_key_secret or token_secret names, without /versions/VERSION."
  }
}

variable "vm_boot_image" {
  description = "The job VMs' boot image (OPENDWS_BOOT_IMAGE): it must carry the NVIDIA driver, Docker with the NVIDIA Container Toolkit and python3 3.8 or later for the agent. The default is a Deep Learning VM GPU family (cloud.google.com/deep-learning-vm/docs/images); a flex pool's boot_image overrides it for that machine type."
  type        = string
  default     = "projects/deeplearning-platform-release/global/images/family/common-cu129-ubuntu-2204-nvidia-580"
}

variable "vm_nat_regions" {
  description = "Regions whose job VMs reach the internet through a Cloud NAT on vm_network (a router and NAT per region); [] (the default): none, and the VMs reach Google's APIs through Private Google Access only."
  type        = list(string)
  default     = []
}

variable "vm_network" {
  description = "The network of the VMs the reconciler creates (OPENDWS_NETWORK)."
  type        = string
  default     = "global/networks/default"
}

variable "iap_ssh" {
  description = "Let IAP TCP forwarding reach port 22 of the VMs (a firewall rule from 35.235.240.0/20 on each network the VMs use), so that `dws ssh` reaches VMs without external addresses."
  type        = bool
  default     = true
}

variable "tpu_runtime_version" {
  description = "One TPU software version for every queued resource (OPENDWS_TPU_RUNTIME_VERSION); empty: each TPU generation gets its own from the catalog (tpu/docs/runtimes)."
  type        = string
  default     = ""
}

variable "tpu_tier" {
  description = "The provisioning of TPU queued resources: flex_start (v2alpha1 provisioningModel FLEX_START), guaranteed or spot (OPENDWS_TPU_TIER)."
  type        = string
  default     = "flex_start"

  validation {
    condition     = contains(["flex_start", "guaranteed", "spot"], var.tpu_tier)
    error_message = "tpu_tier is flex_start, guaranteed or spot."
  }
}

variable "flex_pools" {
  description = "Machine types whose flex-start instance templates Terraform makes (see modules/compute_pools); [] leaves them to the reconciler."
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
}

variable "alert_wait_threshold_seconds" {
  description = "Alert when a pending request has waited longer than this many seconds."
  type        = number
  default     = 86400
}

variable "alert_reconcile_silence_seconds" {
  description = "Alert when no reconcile pass has been recorded for this many seconds."
  type        = number
  default     = 600
}

variable "alert_notification_channels" {
  description = "Cloud Monitoring notification channel ids the alert policies notify (none: incidents show in the console only)."
  type        = list(string)
  default     = []
}
