/// The metadata keys revenue-relay logs with, in one place so dashboards and queries can rely on them.
/// Log messages are constant; what varies goes in metadata under these keys.
public enum LogKey {
    /// A record's place in the record log (Kafka or the embedded log), and the consumer group reading it.
    public static let logTopic = "log.topic"
    public static let logPartition = "log.partition"
    public static let logOffset = "log.offset"
    public static let logGroup = "log.group"
    public static let kafkaClient = "kafka.client"
    public static let notificationStore = "notification.store"
    public static let notificationApp = "notification.app"
    public static let notificationType = "notification.type"
    public static let notificationId = "notification.id"
    public static let error = "error"
    public static let httpListen = "http.listen"
    public static let role = "relay.role"
}
