internal import CRdKafka

extension UnsafeMutablePointer where Pointee == rd_kafka_topic_partition_list_t {
    var elements: UnsafeMutableBufferPointer<rd_kafka_topic_partition_t> {
        UnsafeMutableBufferPointer(start: pointee.elems, count: Int(pointee.cnt))
    }
}
